"""The driver's Ray token, read where Ray looks for it: a file that is not text, or a token no
header can carry, is one line naming where it came from, never the token (exit 2 at the CLI)."""

from __future__ import annotations

import pytest

from sweeper.run.cluster import ClusterUnreachable, _auth_token


def test_a_token_file_that_is_not_text_is_one_line_naming_it(tmp_path, monkeypatch):
    token = tmp_path / "auth_token"
    token.write_bytes(b"\xff\xfe\x00token")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    with pytest.raises(ClusterUnreachable, match=f"the Ray token file {token} is not UTF-8 text"):
        _auth_token()


def test_a_token_no_header_can_carry_is_refused_without_showing_it(tmp_path, monkeypatch):
    token = tmp_path / "auth_token"
    token.write_text("abc\u00e9secret\n")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    with pytest.raises(ClusterUnreachable) as caught:
        _auth_token()
    assert "a non-ASCII character at character 4 of 10" in str(caught.value) and "secret" not in str(caught.value)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "two words")
    with pytest.raises(ClusterUnreachable, match="from RAY_AUTH_TOKEN cannot be sent: it holds a space"):
        _auth_token()


def test_a_plain_token_and_no_token_pass(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "absent"))
    assert _auth_token() is None
    (tmp_path / "auth_token").write_text("  a1b2c3  \n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "auth_token"))
    token = _auth_token()
    assert token is not None and token.value == "a1b2c3"
