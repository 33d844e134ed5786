"""Secret redaction on planted canaries: declared values and well-known credential shapes."""

from __future__ import annotations

import pytest

from corral.policy.redact import HOLD, MARK, MAX_KEY_BLOCK, Redactor

CANARY = "corral-canary-7f3a9c2e51"


@pytest.mark.parametrize(
    "text",
    [
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
    ],
)
def test_credential_shapes_are_redacted_wherever_they_appear(text: str) -> None:
    out = Redactor().text(f"before {text} after")
    assert out == f"before {MARK} after"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abcdefghijklmnop123", f"Authorization: Bearer {MARK}"),
        ("export API_KEY=hunter22hunter", f"export API_KEY={MARK}"),
        ('{"password": "s3cr3t-pass"}', f'{{"password": "{MARK}"}}'),
        ("psql postgresql://app:pa55word@db/x", f"psql postgresql://app:{MARK}@db/x"),
        ("--token=abcd1234efgh", f"--token={MARK}"),
    ],
)
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
    env = {
        "PATH": "/usr/bin",
        "DB_URL": "postgresql://u:pw1234@h/d",
        "MY_TOKEN": "abc",
        "CUSTOM": "visible-value",
    }
    out = Redactor().env(env, secret_keys=["CUSTOM"])
    assert out == {
        "PATH": "/usr/bin",
        "DB_URL": f"postgresql://u:{MARK}@h/d",
        "MY_TOKEN": MARK,
        "CUSTOM": MARK,
    }


def test_token_counts_and_json_literals_are_not_secrets() -> None:
    line = (
        '{"maxOutputTokens":64000,"input_tokens":300,"tokens_out":5,"token":null,'
        '"auth_token":"abcd1234efgh"}'
    )
    assert Redactor().text(line) == line.replace("abcd1234efgh", MARK)


# ---------------------------------------------------------------------------- streams

STREAM_TEXT = (
    f"start {CANARY} middle\n"
    "key=value API_KEY=hunter22hunter and sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789\n"
    "psql postgresql://app:pa55word@db/x; Authorization: Bearer abcdefghijklmnop123\n"
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0123456789\nabcdef==\n"
    "-----END RSA PRIVATE KEY-----\n"
    f"tail {CANARY}"
)
STREAM_EXPECTED = (
    f"start {MARK} middle\n"
    f"key=value API_KEY={MARK} and {MARK}\n"
    f"psql postgresql://app:{MARK}@db/x; Authorization: Bearer {MARK}\n"
    f"{MARK}\n"
    f"tail {MARK}"
).encode()


def streamed(pieces: list[bytes], secrets: tuple[str, ...] = (CANARY,)) -> bytes:
    s = Redactor(secrets).stream()
    return b"".join(s.feed(p) for p in pieces) + s.close()


def test_a_secret_split_across_two_writes_is_caught_wherever_the_split_falls() -> None:
    data = STREAM_TEXT.encode()
    for at in range(len(data) + 1):
        assert streamed([data[:at], data[at:]]) == STREAM_EXPECTED, at


def test_a_stream_written_a_byte_at_a_time_is_redacted_like_the_whole_text() -> None:
    data = STREAM_TEXT.encode()
    assert streamed([data[i : i + 1] for i in range(len(data))]) == STREAM_EXPECTED
    assert Redactor([CANARY]).data(data) == STREAM_EXPECTED


def test_complete_lines_are_written_at_once_and_only_a_possible_secret_waits() -> None:
    s = Redactor([CANARY]).stream()
    assert s.feed(b"line one\nline two\npartial") == b"line one\nline two\n"
    assert s.feed(b" line\n") == b"partial line\n"
    # the start of a declared secret waits for the next piece; a plain word does not
    assert s.feed(b"x " + CANARY[:9].encode()) == b""
    assert s.feed(CANARY[9:].encode() + b" y\n") == f"x {MARK} y\n".encode()
    assert s.close() == b""


def test_a_long_line_without_newline_is_written_in_pieces_holding_back_a_bounded_tail() -> None:
    s = Redactor([CANARY]).stream()
    written = 0
    for _ in range(64):
        written += len(s.feed(b"x" * 10_000))
        assert 0 <= 10_000 * (_ + 1) - written <= HOLD
    written += len(s.close())
    assert written == 640_000


def test_a_key_split_inside_a_long_line_is_not_cut_in_two() -> None:
    key = b"sk-ant-api03-" + b"Z" * 40
    data = b"y" * (HOLD + 100) + b" " + key + b" " + b"y" * 50
    for at in range(HOLD + 90, HOLD + 150):
        out = streamed([data[:at], data[at:]], secrets=())
        assert b"ZZZZZ" not in out, at


def test_bytes_that_are_not_utf8_pass_through_unchanged() -> None:
    data = b"\xff\xfe binary \x00\x01 " + CANARY.encode() + b" \xc3\x28\n"
    assert streamed([data[:5], data[5:]]) == b"\xff\xfe binary \x00\x01 [REDACTED] \xc3\x28\n"


def test_a_begin_line_without_end_does_not_swallow_the_rest_of_the_output() -> None:
    s = Redactor().stream()
    out = s.feed(b"-----BEGIN PRIVATE KEY-----\n" + b"A" * (MAX_KEY_BLOCK + 200) + b"\n")
    out += s.feed(b"later output\n") + s.close()
    assert out.startswith(MARK.encode()) and out.endswith(b"later output\n")
    assert len(out) < 200


def test_found_lists_the_secrets_a_text_holds() -> None:
    r = Redactor([CANARY])
    text = f"run {CANARY} --token=abcd1234efgh ghp_0123456789abcdefghijABCDEFGHIJklmn n=3"
    assert r.found(text) == [CANARY, "abcd1234efgh", "ghp_0123456789abcdefghijABCDEFGHIJklmn"]
    assert r.found('{"input_tokens": 300, "token": null}') == []
