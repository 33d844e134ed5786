"""Secret redaction on planted canaries: declared values and well-known credential shapes."""

from __future__ import annotations

import pytest

from corral.policy.redact import MARK, Redactor

CANARY = "corral-canary-7f3a9c2e51"


@pytest.mark.parametrize("text", [
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "sk-proj-0123456789abcdefghijABCDEFGHIJ",
    "ghp_0123456789abcdefghijABCDEFGHIJklmn",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstu",
    "AKIAIOSFODNN7EXAMPLE",
    "xoxb-123456789012-abcdefghijkl",
    "AIzaSyA-0123456789abcdefghijklmnopqrstu",
    "glpat-abcdefghij0123456789",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
])
def test_credential_shapes_are_redacted_wherever_they_appear(text: str) -> None:
    out = Redactor().text(f"before {text} after")
    assert out == f"before {MARK} after"


@pytest.mark.parametrize(("text", "expected"), [
    ("Authorization: Bearer abcdefghijklmnop123", f"Authorization: Bearer {MARK}"),
    ("export API_KEY=hunter22hunter", f"export API_KEY={MARK}"),
    ('{"password": "s3cr3t-pass"}', f'{{"password": "{MARK}"}}'),
    ("psql postgresql://app:pa55word@db/x", f"psql postgresql://app:{MARK}@db/x"),
    ("--token=abcd1234efgh", f"--token={MARK}"),
])
def test_named_secrets_keep_their_name_and_lose_their_value(text: str, expected: str) -> None:
    assert Redactor().text(text) == expected


def test_declared_values_are_redacted_verbatim_longest_first() -> None:
    r = Redactor([CANARY, CANARY + "-suffix", "s3cret"])
    assert r.text(f"x{CANARY}-suffix y {CANARY}") == f"x{MARK} y {MARK}"
    assert r.text("s3cret words stay") == f"{MARK} words stay"
    assert Redactor(["abc"]).text("abc") == "abc"  # too short to declare: would blank words


def test_ordinary_text_is_left_alone() -> None:
    text = "kubectl get pods -n prod | grep token-rotation; ls -la ~/.ssh; sk-short"
    assert Redactor().text(text) == text


def test_json_values_are_redacted_recursively() -> None:
    r = Redactor([CANARY])
    out = r.obj({"command": f"echo {CANARY}", "nested": [{"k": CANARY}], "n": 3, CANARY: True})
    assert out == {"command": f"echo {MARK}", "nested": [{"k": MARK}], "n": 3, MARK: True}


def test_an_environment_for_display_masks_marked_and_secret_looking_names() -> None:
    env = {"PATH": "/usr/bin", "DB_URL": "postgresql://u:pw1234@h/d", "MY_TOKEN": "abc",
           "CUSTOM": "visible-value"}
    out = Redactor().env(env, secret_keys=["CUSTOM"])
    assert out == {"PATH": "/usr/bin", "DB_URL": f"postgresql://u:{MARK}@h/d",
                   "MY_TOKEN": MARK, "CUSTOM": MARK}


def test_token_counts_and_json_literals_are_not_secrets() -> None:
    line = ('{"maxOutputTokens":64000,"input_tokens":300,"tokens_out":5,"token":null,'
            '"auth_token":"abcd1234efgh"}')
    assert Redactor().text(line) == line.replace("abcd1234efgh", MARK)
