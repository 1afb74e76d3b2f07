"""``clipper deploy --canary`` and ``clipper canary`` end to end against moto's server (a real presigned PUT, the
model updater run on each upload as the S3 notification would): a canary deployment is never made active, even
with the model's auto-promote on (the upload's promote wish is false); it starts as the canary once registered,
``clipper canary`` shows it and its events, ``inspect`` its share and last decision; promote and rollback by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clipper.cli import main
from tests.integration.test_cli_deploy import TOKEN, api  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


def test_deploy_as_a_canary_then_look_promote_and_roll_back(api, demo_models, capsys):  # noqa: F811
    model = str(Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx")

    def clipper(*argv: str) -> int:
        return main(["--url", api, "--token", TOKEN, *argv])

    assert clipper("auto-promote", "mlp", "on") == 0  # a canary upload must not be promoted even so
    capsys.readouterr()

    assert clipper("deploy", "mlp", "2", model, "--canary", "10", "--min-feedback", "30", "--timeout", "60") == 0
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert info["is_current_version"] is False
    assert info["canary"]["version"] == "2" and info["canary"]["share"] == 0.1
    assert info["canary"]["params"]["min_feedback"] == 30
    assert "clipper: mlp:2 is the canary on 10% of mlp's queries beside 1" in err.splitlines()[-1], err

    assert clipper("canary", "mlp") == 0
    table = capsys.readouterr().out
    assert "mlp: canary 2 on 10% of the queries beside 1" in table
    assert "min_feedback 30" in table and "start" in table and "operator" in table
    assert clipper("canary", "mlp", "--json") == 0
    assert json.loads(capsys.readouterr().out)["events"][0]["kind"] == "start"
    assert clipper("inspect") == 0
    assert "2 @ 10%" in capsys.readouterr().out

    # a second canary deployment is refused before anything is uploaded
    assert clipper("deploy", "mlp", "3", model, "--canary", "10", "--timeout", "10") == 2
    assert "409 conflict: model mlp has a canary running already (mlp:2" in capsys.readouterr().err
    assert clipper("model", "mlp", "3") == 2
    capsys.readouterr()
    # so is a deployment to make active (it was uploaded and registered, then refused activation: a bare 409, and
    # the same deploy again a 409 for the version; found by a review helper)
    assert clipper("deploy", "mlp", "3", model, "--timeout", "10") == 2
    err = capsys.readouterr().err
    assert "a new version cannot become active meanwhile; deploy it with --no-promote" in err, err
    assert clipper("model", "mlp", "3") == 2  # nothing uploaded
    capsys.readouterr()

    assert clipper("canary", "mlp", "--promote") == 0
    assert json.loads(capsys.readouterr().out)["active_version"] == "2"
    assert clipper("canary", "mlp") == 0
    table = capsys.readouterr().out
    assert "no canary running (active version 2)" in table and "promote" in table
    assert clipper("rollback", "mlp") == 0
    assert json.loads(capsys.readouterr().out)["active_version"] == "1"
    assert clipper("canary", "mlp", "--abort") == 2  # none runs: refused (409)
    assert "409 conflict: model mlp: no canary running (active version 1)" in capsys.readouterr().err

    # a share or a canary parameter without --start is refused, not ignored (it exited 0 as if it changed something)
    assert clipper("canary", "mlp", "--share", "20", "--min-feedback", "40") == 2
    assert "--share, --min-feedback go with --start VERSION" in capsys.readouterr().err
    assert clipper("canary", "mlp", "--abort", "--share", "20") == 2  # nor with --promote or --abort
    assert "--share go with --start VERSION" in capsys.readouterr().err
    # a registered version started as the canary by hand, then aborted
    assert clipper("canary", "mlp", "--start", "2", "--share", "20", "--max-feedback", "900") == 0
    started = json.loads(capsys.readouterr().out)["canary"]
    assert started["share"] == 0.2 and started["params"]["max_feedback"] == 900
    assert clipper("canary", "mlp", "--abort") == 0
    assert json.loads(capsys.readouterr().out)["active_version"] == "1"


def test_a_canary_needs_a_model_with_an_active_version(api, demo_models, capsys):  # noqa: F811
    model = str(Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx")

    code = main(["--url", api, "--token", TOKEN, "deploy", "newmodel", "1", model, "--canary", "10"])

    assert code == 2
    assert "model newmodel does not exist: a first version becomes active" in capsys.readouterr().err
    assert main(["--url", api, "--token", TOKEN, "model", "newmodel", "1"]) == 2  # nothing uploaded


def test_a_canary_share_or_parameter_the_api_refuses_is_refused_before_the_upload(api, demo_models, capsys):  # noqa: F811
    """``--canary 100`` uploaded and registered the version, then the API refused the share: the version stayed
    registered (its server and batcher running) and a second deploy of it was a 409 (a new user's run)."""
    model = str(Path(demo_models["out_dir"]) / "mlp" / "1" / "model.onnx")

    def clipper(*argv: str) -> int:
        return main(["--url", api, "--token", TOKEN, *argv])

    for options, cause in [
        (["--canary", "100"], "share_percent: Input should be less than 100"),
        (["--canary", "0"], "share_percent: Input should be greater than 0"),
        (["--canary", "10", "--alpha", "0.7"], "params.alpha"),
    ]:
        assert clipper("deploy", "mlp", "2", model, *options, "--timeout", "10") == 2
        err = capsys.readouterr().err
        assert f"400 invalid input: {cause}" in err and "uploading" not in err, err
        assert clipper("model", "mlp", "2") == 2  # nothing uploaded
        capsys.readouterr()
    assert clipper("deploy", "mlp", "2", model, "--canary", "10", "--timeout", "60") == 0
