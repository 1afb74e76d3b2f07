"""The admin commands' number options refuse what is not a finite number, naming the option, before any call."""

from __future__ import annotations

import pytest

from clipper.cli import main

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "argv",
    [
        ["policy-params", "digits", "--eta", "nan"],
        ["policy-params", "digits", "--gamma", "inf"],
        ["policy-params", "digits", "--loss-scale=-inf"],
        ["canary", "mlp", "--start", "2", "--share", "NaN"],
        ["canary", "mlp", "--start", "2", "--alpha", "infinity"],
    ],
)
def test_nan_and_infinity_are_refused_naming_the_option(argv, capsys, monkeypatch):
    """``--eta nan`` went to the API, which answered 'eta: greater than 0' (NaN fails every bound)."""
    monkeypatch.setenv("CLIPPER_URL", "http://127.0.0.1:9")  # nothing listens: a call would fail otherwise
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    option = next(a for a in argv if a.startswith("--") and a != "--start").split("=")[0]
    assert f"argument {option}: a finite number; got" in err, err


def test_a_word_is_refused_as_not_a_number(capsys):
    with pytest.raises(SystemExit):
        main(["policy-params", "digits", "--eta", "fast"])
    assert "argument --eta: a number, e.g. 0.1; got 'fast'" in capsys.readouterr().err
