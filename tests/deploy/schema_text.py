"""Helm's message for a value that fails a pattern of values.schema.json: what the value
may be, in words, instead of the regular expression.

Helm prints a failed ``pattern`` as ``Does not match pattern '<the regex>'`` and never a
schema's description (gojsonschema up to Helm 3.17; the same holds for later versions'
validator). So each pattern-checked value is written as ``if`` (its checks) and ``else``:
a ``const`` of a sentence saying what the value may be, which nothing can equal (``not``
the same ``const``). A good value passes ``if``; a bad one fails ``else``, and Helm's line
reads ``interval: interval does not match: "a duration from 100ms to 1h: ..."``. The
values accepted are exactly the patterns'. ``python -m tests.deploy.schema_text``
rewrites the schema's bare patterns into that form (after a setting with a pattern was
added); a pattern without a sentence in :data:`ALLOWED` is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

# The keywords that move into ``if``: the checks a sentence describes.
CHECKS = ("pattern", "minimum", "maximum", "allOf")
COMMENT = "never valid: Helm names this const when `if` fails (tests/deploy/schema_text.py)"

_TEXT = r"^[^\x00-\x1f\x7f]*$"
_NOT_BLANK = r"^[^\x00-\x1f\x7f]*[^\x00-\x20\x7f][^\x00-\x1f\x7f]*$"
_NAME = r"^(?:[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)?$"
_PORT = (r"(?:[0-9]{1,4}|[0-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]"
         r"|6553[0-5])")
_HOST = r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*\])"

# Each pattern of the schema and what it lets through, in words.
ALLOWED = {
    r"^(?:(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)?$":
        "an image name without its tag: [REGISTRY[:PORT]/]NAME, the name in lower case "
        "(registry.example.com/otel-gpu)",
    r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$":
        "an image tag: letters, digits, _, . and -, at most 128, not starting with . or -",
    r"^\s*(?:otel|dcgm|kubelet)\s*(?:,\s*(?:otel|dcgm|kubelet)\s*)*$":
        "otel, dcgm or kubelet, or several of them comma-separated (otel,dcgm)",
    rf"^\s*{_HOST}?:{_PORT}\s*$":
        "an address HOST:PORT or :PORT, port 0 to 65535 (0.0.0.0:9400, [::]:9400)",
    rf"^\s*(?:{_HOST}?:{_PORT})?\s*$":
        "an address HOST:PORT or :PORT, port 0 to 65535 (0.0.0.0:9401)",
    _TEXT: "text without control characters",
    _NOT_BLANK: "a path or name: not blank, without control characters",
    r"^(?:\s*|\s*(?:prometheus|otlp)\s*(?:,\s*(?:prometheus|otlp)\s*)*)$":
        "prometheus, otlp, or both comma-separated (prometheus,otlp)",
    r"^/": "an absolute path, starting with /",
    _NAME: "a Kubernetes object name: lower-case letters, digits, - and ., beginning and "
           "ending with a letter or digit",
    r"^[-._a-zA-Z0-9]+$": "a key of a Secret: letters, digits, -, _ and .",
    r"^\$2[abxy]\$(?P<cost>\d\d)\$[./A-Za-z0-9]{21}[.Oeu][./A-Za-z0-9]{30}"
    r"[.CGKOSWaeimquy26]$":
        "a bcrypt hash ($2y$10$ and 53 characters), as htpasswd -nbBC 10 USER PASSWORD "
        "writes it",
    r"^(?:[A-Za-z0-9*](?:[-A-Za-z0-9.]*[A-Za-z0-9])?)?$":
        "a DNS name (otel-gpu.monitoring.svc)",
    r"^[0-9]+%$": "a number of nodes, or a percentage of them (10%)",
    r"^(?:0|(?:[0-9]+y)?(?:[0-9]+w)?(?:[0-9]+d)?(?:[0-9]+h)?(?:[0-9]+m)?(?:[0-9]+s)?"
    r"(?:[0-9]+ms)?)$":
        "a Prometheus duration (30s, 1m, 1m30s)",
    r"^(?:[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)?$":
        "a namespace: lower-case letters, digits and -, at most 63, beginning and ending "
        "with a letter or digit",
    r"^[+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i?|[munk])?$":
        "a Kubernetes quantity (64Mi, 1Gi, 20m, 0.5)",
}
_OTLP = (r"^(?:|(?:[Hh][Tt][Tt][Pp][Ss]?://" + _HOST[:-1]
         + r")(?::(?:0*[1-9][0-9]{0,3}|0*[1-5][0-9]{4}|0*6[0-4][0-9]{3}|0*65[0-4][0-9]{2}"
           r"|0*655[0-2][0-9]|0*6553[0-5]))?(?:[/?#][^\s]*)?|(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]"
           r"{0,251}[A-Za-z0-9_])?|\[(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?"
           r"|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)\]):[0-9]+))$")
ALLOWED[_OTLP] = ("an OTLP endpoint: http://HOST[:PORT][/PATH] or https://..., port 1 to "
                  "65535, or HOST:PORT (http://collector:4318, collector:4317)")


def explained(node: dict, allowed: str) -> dict:
    """The node with its checks under ``if`` and ``allowed`` in the ``else`` Helm names."""
    checks = {key: node[key] for key in CHECKS if key in node}
    rest = {key: value for key, value in node.items() if key not in CHECKS}
    rest.setdefault("description", allowed)
    return {**rest, "if": checks,
            "else": {"$comment": COMMENT, "const": allowed, "not": {"const": allowed}}}


def unexplained(node, path: str = "(root)"):
    """(path, pattern) of every pattern not yet under an ``if`` with its ``else``."""
    if isinstance(node, dict):
        if "pattern" in node:
            yield path, node["pattern"]
        for key, child in node.items():
            if key == "if" and "else" in node:
                continue  # checks already explained
            yield from unexplained(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from unexplained(child, f"{path}/{i}")


def _rewritten(node, path: str):
    if isinstance(node, dict):
        if "pattern" in node and not ("if" in node and "else" in node):
            if node["pattern"] not in ALLOWED:
                raise SystemExit(f"{path}: no sentence for pattern {node['pattern']!r}: add "
                                 "one to ALLOWED in tests/deploy/schema_text.py")
            node = explained(node, ALLOWED[node["pattern"]])
        return {key: (value if key in ("if", "else") else _rewritten(value, f"{path}/{key}"))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_rewritten(child, f"{path}/{i}") for i, child in enumerate(node)]
    return node


def rewrite(path: Path) -> None:
    """Rewrite the schema at ``path``: every bare pattern explained, the rest unchanged."""
    schema = json.loads(path.read_text())
    path.write_text(json.dumps(_rewritten(schema, "(root)"), indent=2, ensure_ascii=False)
                    + "\n")


if __name__ == "__main__":  # python -m tests.deploy.schema_text: after adding a pattern
    rewrite(Path(__file__).resolve().parents[2] / "deploy/helm/otel-gpu/values.schema.json")
