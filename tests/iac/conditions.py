"""What a translated template becomes for given parameter values: conditions evaluated, `Fn::If` chosen,
`AWS::NoValue` dropped, conditional resources and outputs removed (what CloudFormation does before it creates
anything). Other intrinsics (Ref to resources, GetAtt, Sub) are left as they are.

Only the condition functions the templates use are understood; anything else raises, so a test never passes
on a condition it could not evaluate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NO_VALUE = {"Ref": "AWS::NoValue"}


def parameter_values(template: Mapping[str, Any], overrides: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, spec in template.get("Parameters", {}).items():
        raw = overrides.get(name, spec.get("Default"))
        if spec.get("Type") == "CommaDelimitedList" and isinstance(raw, str):
            raw = raw.split(",")
        values[name] = raw
    unknown = set(overrides) - set(values)
    assert not unknown, f"not parameters of the template: {unknown}"
    return values


def evaluate_conditions(template: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, bool]:
    conditions = template.get("Conditions", {})
    results: dict[str, bool] = {}

    def value(node: Any) -> Any:
        if isinstance(node, dict):
            ((fn, arg),) = node.items()
            if fn == "Ref":
                return params[arg]
            if fn == "Fn::Join":
                return arg[0].join(str(v) for v in value(arg[1]))
            if fn == "Condition":
                return condition(arg)
            return boolean(node)
        return node

    def boolean(node: Any) -> bool:
        ((fn, args),) = node.items()
        if fn == "Fn::Equals":
            left, right = (value(a) for a in args)
            return str(left) == str(right)
        if fn == "Fn::Not":
            return not value(args[0])
        if fn == "Fn::And":
            return all(value(a) for a in args)
        if fn == "Fn::Or":
            return any(value(a) for a in args)
        if fn == "Condition":
            return condition(args)
        raise AssertionError(f"condition function {fn} not understood")

    def condition(name: str) -> bool:
        if name not in results:
            results[name] = boolean(conditions[name])
        return results[name]

    for name in conditions:
        condition(name)
    return results


def resolve(template: Mapping[str, Any], **overrides: str) -> dict[str, Any]:
    """The template as CloudFormation would create it with these parameter values (others: defaults)."""
    params = parameter_values(template, overrides)
    conditions = evaluate_conditions(template, params)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {"Fn::If"}:
                name, when_true, when_false = node["Fn::If"]
                return walk(when_true if conditions[name] else when_false)
            walked = {k: walk(v) for k, v in node.items()}
            return {k: v for k, v in walked.items() if v != NO_VALUE}
        if isinstance(node, list):
            return [w for w in (walk(item) for item in node) if w != NO_VALUE]
        return node

    resolved: dict[str, Any] = {}
    for section, body in template.items():
        if section in ("Resources", "Outputs"):
            kept = {k: v for k, v in body.items() if "Condition" not in v or conditions[v["Condition"]]}
            resolved[section] = walk(kept)
        else:
            resolved[section] = body
    resolved["_conditions"] = conditions
    return resolved
