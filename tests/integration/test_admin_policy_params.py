"""``set_policy_params`` over HTTP: stored with the application in the registry (DynamoDB, moto), answered with
the parameters the policy runs with, refused with a 400 naming the field; and from the client and the CLI."""

from __future__ import annotations

import json

import pytest

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.client import AdminError, ClipperConnection
from clipper.selection import PolicyParams
from tests.integration.test_admin_api import DIGITS, admin, ok  # noqa: F401  (fixture)
from tests.integration.test_cli import TOKEN, api, clipper  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def test_parameters_are_stored_with_the_app_and_used_by_its_policy(admin, aws) -> None:  # noqa: F811
    ok(admin.post("/admin/add_app", json={**DIGITS, "policy": "exp3"}))
    info = ok(admin.post("/admin/set_policy_params", json={"name": "digits", "eta": 0.5, "gamma": 0.1}))
    assert info["policy_params"] == {"eta": 0.5, "gamma": 0.1, "epsilon": None, "k": None, "loss_scale": None}
    assert info["policy_params_in_use"] == {"gamma": 0.1, "eta": 0.5, "min_ratio": 1e-4, "loss_scale": 1.0}
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    assert registry.get_app("digits").policy_params == PolicyParams(eta=0.5, gamma=0.1)

    # omitted: unchanged; null: back to the default
    info = ok(admin.post("/admin/set_policy_params", json={"name": "digits", "gamma": None}))
    assert info["policy_params_in_use"]["gamma"] == 0.02 and info["policy_params_in_use"]["eta"] == 0.5
    # a later change of policy keeps them (exp4 takes eta too) and the app's answer shows them
    ok(admin.post("/admin/set_app_policy", json={"name": "digits", "policy": "exp4"}))
    shown = ok(admin.post("/admin/get_application", json={"name": "digits"}))
    assert shown["policy_params"]["eta"] == 0.5
    # and what the policy runs with, defaults included (it was in set_policy_params' answer only); k: the models a
    # query asks, every linked one (none here)
    in_use = {"eta": 0.5, "k": 0, "min_ratio": 1e-4, "tolerance": 0.1, "loss_scale": 1.0}
    assert shown["policy_params_in_use"] == in_use
    assert registry.get_app("digits").policy_params == PolicyParams(eta=0.5)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"eta": -1}, "eta"),
        ({"eta": 0}, "eta"),
        ({"gamma": 1.5}, "gamma"),
        ({"epsilon": 0}, "epsilon"),
        ({"k": 0}, "k"),
        ({"k": 2}, "k"),  # exp3 takes no k
        ({"epsilon": 0.2}, "epsilon"),  # nor epsilon
        ({"temperature": 1}, "temperature"),
        ({"loss_scale": 0}, "loss_scale"),
        ({"loss_scale": -2.5}, "loss_scale"),
        ({"loss_scale": "1e400"}, "loss_scale"),
        # beyond what DynamoDB stores (under 1e-130, over 1e125): the body's own check (schemas.Number)
        ({"eta": 1e-200}, "eta"),
        ({"eta": 1e200}, "eta"),
        ({"loss_scale": 1e-200}, "loss_scale"),
        ({"loss_scale": 1e200}, "loss_scale"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field_and_change_nothing(admin, aws, body, field) -> None:  # noqa: F811
    ok(admin.post("/admin/add_app", json={**DIGITS, "policy": "exp3"}))
    refused = admin.post("/admin/set_policy_params", json={"name": "digits", **body})
    assert refused.status_code == 400 and refused.json()["cause"].startswith(f"{field}:"), refused.text
    assert DynamoDBRegistry(aws.dynamodb, aws.registry_table).get_app("digits").policy_params == PolicyParams()
    assert admin.post("/admin/set_policy_params", json={"name": "nope", "eta": 1}).status_code == 404


def test_the_client_and_the_cli_set_them(api, capsys) -> None:  # noqa: F811
    conn = ClipperConnection(api["url"], TOKEN)
    conn.set_app_policy("digits", "exp4")
    one = conn.set_policy_params("digits", eta=0.3, k=1)
    assert one["policy_params_in_use"]["k"] == 1 and "note" not in one
    many = conn.set_policy_params("digits", k=9)  # accepted (the links may change), and said to be all of them
    assert many["policy_params"]["k"] == 9 and many["policy_params_in_use"]["k"] == 1  # the one linked model
    assert many["note"] == "k 9 is more than the models linked (1): each of them answers"
    conn.set_policy_params("digits", k=1)
    with pytest.raises(AdminError) as refused:
        conn.set_policy_params("digits", gamma=0.5)
    assert refused.value.status == 400 and refused.value.cause.startswith("gamma: expected a parameter of exp4")

    assert clipper(api, "policy-params", "digits", "--eta", "0.8", "--default", "k") == 0
    assert json.loads(capsys.readouterr().out)["policy_params_in_use"]["eta"] == 0.8
    assert clipper(api, "policy-params", "digits") == 0
    assert json.loads(capsys.readouterr().out) == {
        "eta": 0.8,
        "gamma": None,
        "epsilon": None,
        "k": None,
        "loss_scale": None,
    }
    assert api["registry"].get_app("digits").policy_params == PolicyParams(eta=0.8)
    assert clipper(api, "policy-params", "digits", "--epsilon", "0.2") == 2
    assert "epsilon: expected a parameter of exp4" in capsys.readouterr().err


def test_the_loss_scale_is_every_policys_and_set_from_the_client_and_the_cli(api, capsys) -> None:  # noqa: F811
    """A regression application's scores judged on its own scale: taken by each policy (the canary's evidence and
    the selection report judge a single-model application's outputs too), kept across a change of policy."""
    conn = ClipperConnection(api["url"], TOKEN)
    assert conn.set_policy_params("digits", loss_scale=250.0)["policy_params_in_use"] == {"loss_scale": 250.0}
    for policy in ("epsilon_greedy", "exp3", "exp4"):
        conn.set_app_policy("digits", policy)
        assert conn.get_app_info("digits")["policy_params"]["loss_scale"] == 250.0
    assert clipper(api, "policy-params", "digits", "--loss-scale", "40") == 0
    assert json.loads(capsys.readouterr().out)["policy_params_in_use"]["loss_scale"] == 40.0
    assert api["registry"].get_app("digits").policy_params == PolicyParams(loss_scale=40.0)
    assert clipper(api, "policy-params", "digits", "--default", "loss_scale") == 0
    assert json.loads(capsys.readouterr().out)["policy_params_in_use"]["loss_scale"] == 1.0


def test_exp4s_k_in_use_is_the_number_of_models_each_query_asks(api, capsys) -> None:  # noqa: F811
    """Exp4's default k (unset: every linked model) was shown as "k": null, which reads as nothing or unknown: in
    use it is the number of linked models the frontend asks, and a k above it asks each of them."""
    from tests.fakes import model_version

    api["registry"].put_version(model_version("lr", "1"), activate=True)
    api["registry"].link("digits", "lr")
    conn = ClipperConnection(api["url"], TOKEN)
    conn.set_app_policy("digits", "exp4")
    info = conn.get_app_info("digits")
    assert info["policy_params"]["k"] is None and info["policy_params_in_use"]["k"] == 2  # both linked models
    assert clipper(api, "app", "digits") == 0
    assert json.loads(capsys.readouterr().out)["policy_params_in_use"]["k"] == 2
    assert conn.set_policy_params("digits", k=1)["policy_params_in_use"]["k"] == 1
    many = conn.set_policy_params("digits", k=9)
    assert many["policy_params"]["k"] == 9 and many["policy_params_in_use"]["k"] == 2  # as stored; as used
    assert conn.set_policy_params("digits", k=None)["policy_params_in_use"]["k"] == 2
    conn.unlink_model_from_app("digits", "lr")
    assert conn.get_app_info("digits")["policy_params_in_use"]["k"] == 1  # it follows the links
    conn.set_app_policy("digits", "exp3")
    assert "k" not in conn.get_app_info("digits")["policy_params_in_use"]  # a parameter exp3 does not take
