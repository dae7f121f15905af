"""HTTP tools, the pure part (:mod:`agentrun.core.http_tool`): the URL filled from the
arguments and percent-encoded, the allow-list of hosts against URLs made to slip past it,
which redirects are followed, the body, the headers with the idempotency key, and what the
model reads of a response."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun.api import agent as a
from agentrun.api import http_tool as api
from agentrun.core import http_tool as h

ALLOWED = ["allowed.example", "127.0.0.1", "[::1]:8080", "api.example:8443"]


def _http(**changes: Any) -> api.HttpRequest:
    body: dict[str, Any] = {
        "url": "https://allowed.example/users/{user}?q={q}",
        "allowedHosts": ["allowed.example"],
    }
    body.update(changes)
    return api.HttpRequest.model_validate(body)


def _tool(**http: Any) -> a.AgentTool:
    return a.AgentTool.model_validate(
        {
            "name": "lookup",
            "description": "Look a user up.",
            "parameters": {
                "type": "object",
                "properties": {"user": {"type": "string"}, "q": {}, "note": {}},
                "required": ["user"],
            },
            "http": {**_http().to_wire(), **http},
        }
    )


# -- the URL ---------------------------------------------------------------------------------


def test_placeholders_are_filled_percent_encoded_so_an_argument_stays_in_its_place() -> None:
    url = h.fill_url(
        "https://allowed.example/users/{user}/x?q={q}", {"user": "a/b?c#d@e:f", "q": "x y&z=1"}
    )
    assert url == "https://allowed.example/users/a%2Fb%3Fc%23d%40e%3Af/x?q=x%20y%26z%3D1"
    target = h.check_url(url, ALLOWED)
    assert (target.host, target.port) == ("allowed.example", 443)
    assert target.path == "/users/a%2Fb%3Fc%23d%40e%3Af/x?q=x%20y%26z%3D1"


def test_numbers_and_booleans_are_their_json_text_and_unreserved_characters_stay() -> None:
    arguments = {"a": 42, "b": 1.5, "c": True, "d": "A-z_.~9"}
    assert h.fill_url("http://h/{a}/{b}/{c}/{d}", arguments) == "http://h/42/1.5/true/A-z_.~9"
    assert h.fill_url("http://h/{a}", {"a": "é"}) == "http://h/%C3%A9"


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({}, "the URL needs the argument user"),
        ({"user": None}, "the URL needs the argument user"),
        ({"user": {"id": 1}}, "the argument user is an object"),
        ({"user": [1]}, "the argument user is an array"),
        ({"user": ".."}, "may not be '..'"),
        ({"user": "."}, "may not be '.'"),
    ],
)
def test_a_url_that_cannot_be_filled_is_refused(arguments: dict[str, Any], said: str) -> None:
    with pytest.raises(h.Refused, match=said.replace("(", r"\(").replace(".", r"\.")):
        h.fill_url("https://allowed.example/users/{user}", arguments)


@pytest.mark.parametrize(
    "url",
    [
        "http://allowed.example/x",
        "https://allowed.example:8443/x?y=1",
        "HTTP://ALLOWED.EXAMPLE./x",  # case and the root's dot are one host
        "http://127.0.0.1:9/",
        "http://[::1]:8080/a",
        "http://[0:0::1]:8080/a",  # the same IPv6 address, written otherwise
        "https://api.example:8443/",
    ],
)
def test_an_allowed_host_passes(url: str) -> None:
    target = h.check_url(url, ALLOWED)
    assert target.url.startswith(("http://", "https://"))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        # A suffix, a prefix, a look-alike: only the host itself.
        ("http://allowed.example.evil.com/", "allowed.example.evil.com:80 is not among"),
        ("http://evil-allowed.example/", "is not among"),
        ("http://allowed.examp1e/", "is not among"),
        # Userinfo, in every spelling: never sent.
        ("http://allowed@evil/", "has userinfo"),
        ("http://allowed.example@evil.com/", "has userinfo"),
        ("http://allowed.example:80@evil.com/", "has userinfo"),
        ("http://user:pw@allowed.example/", "has userinfo"),
        # What other parsers read another host out of.
        ("http://evil.com#@allowed.example/", "evil.com:80 is not among"),
        ("http://evil.com?@allowed.example/", "evil.com:80 is not among"),
        ("http://allowed.example\\.evil.com/", "not a host name"),
        ("http://%61llowed.example/", "not a host name"),
        ("http://allowed%2eexample/", "not a host name"),
        ("http://allowed。example/", "not printable ASCII"),
        ("http://allowed.example /", "not printable ASCII"),
        ("http://allowed.example\t/", "not printable ASCII"),
        # IP literals: only as written in allowedHosts.
        ("http://127.1/", "127.1:80 is not among"),
        ("http://2130706433/", "2130706433:80 is not among"),
        ("http://0x7f.0.0.1/", "is not among"),
        ("http://0177.0.0.1/", "is not among"),
        ("http://[::ffff:127.0.0.1]/", "is not among"),
        ("http://[::1]/", r"\[::1\]:80 is not among"),  # allowed on 8080 only
        ("http://[::1/", "cannot be read"),
        # A port the entry does not name; the scheme's default port is a port.
        ("https://api.example/", "api.example:443 is not among"),
        ("http://allowed.example:99999/", "is not a port"),
        ("ftp://allowed.example/", "is not http or https"),
        ("http:///x", "not a host name"),
    ],
)
def test_a_host_not_allowed_is_refused(url: str, said: str) -> None:
    with pytest.raises(h.Refused, match=said):
        h.check_url(url, ALLOWED)


def test_a_placeholder_in_the_host_cannot_reach_another_host() -> None:
    http = _http(url="https://{region}.allowed.example/x", allowedHosts=["eu.allowed.example"])
    assert h.request_of(http, {"region": "eu"}, "k").target.host == "eu.allowed.example"
    for region in ("evil.com/", "evil.com#", "x@evil.com", "evil.com:80"):
        with pytest.raises(h.Refused, match="not a host name"):
            h.request_of(http, {"region": region}, "k")
    http = _http(url="https://{host}/x", allowedHosts=["allowed.example"])
    with pytest.raises(h.Refused, match=r"allowed\.example\.evil\.com:443 is not among"):
        h.request_of(http, {"host": "allowed.example.evil.com"}, "k")


def test_a_fragment_is_never_sent() -> None:
    assert h.check_url("http://allowed.example/a?b=1#c", ALLOWED).path == "/a?b=1"


# -- redirects -------------------------------------------------------------------------------


def test_a_redirect_is_followed_only_to_an_allowed_url_keeping_https() -> None:
    here = h.check_url("https://allowed.example/a/b", ALLOWED)
    same = h.redirect(here, "../c?d=1", ALLOWED)
    assert isinstance(same, h.Target) and same.url == "https://allowed.example/c?d=1"
    other = h.redirect(here, "https://api.example:8443/x", ALLOWED)
    assert isinstance(other, h.Target) and other.host == "api.example"
    assert "evil.com:443 is not among" in str(h.redirect(here, "https://evil.com/", ALLOWED))
    assert "has userinfo" in str(h.redirect(here, "https://allowed.example@evil.com/", ALLOWED))
    assert "from https to" in str(h.redirect(here, "http://allowed.example/", ALLOWED))
    assert h.redirect(here, None, ALLOWED) == "it names no Location"
    plain = h.check_url("http://allowed.example/", ALLOWED)
    assert isinstance(h.redirect(plain, "https://allowed.example/", ALLOWED), h.Target)


# -- the body and the headers ----------------------------------------------------------------


def test_the_body_is_an_argument_or_a_template_filled() -> None:
    by_argument = api.HttpBody(argument="payload")
    assert json.loads(h.fill_body(by_argument, {"payload": [1, {"a": "b"}]})) == [1, {"a": "b"}]
    with pytest.raises(h.Refused, match="which the call does not give"):
        h.fill_body(by_argument, {})
    template = api.HttpBody(
        template={
            "user": "{user}",
            "count": "{n}",
            "note": "{note}",
            "text": "hello {user}, {n} times",
            "items": ["{user}", "{note}", 3],
            "fixed": {"deep": True},
        }
    )
    filled = json.loads(h.fill_body(template, {"user": "ann", "n": 2}))
    assert filled == {
        "user": "ann",
        "count": 2,  # a whole placeholder keeps the argument's JSON type
        "text": "hello ann, 2 times",
        "items": ["ann", 3],  # what the call does not give is left out
        "fixed": {"deep": True},
    }
    with pytest.raises(h.Refused, match="the body needs the argument user"):
        h.fill_body(api.HttpBody(template={"text": "hi {user}"}), {})


def test_the_request_carries_the_headers_the_body_and_the_idempotency_key() -> None:
    http = _http(
        method="POST",
        headers=[
            {"name": "Accept", "value": "application/json"},
            {"name": "Authorization", "secretKeyRef": {"name": "api", "key": "token"}},
        ],
        body={"template": {"user": "{user}"}},
    )
    request = h.request_of(http, {"user": "ann", "q": 1}, "uid:1:c1:abc")
    assert request.method == "POST"
    assert request.target.url == "https://allowed.example/users/ann?q=1"
    assert request.headers == (
        ("User-Agent", h.USER_AGENT),
        ("Accept", "application/json"),
        ("Content-Type", "application/json"),
        ("Idempotency-Key", "uid:1:c1:abc"),
    )
    assert request.secret_headers == ("Authorization",)
    assert request.body == b'{"user":"ann"}'
    # A key the model's call id made unfit for a header is sent as its sha256, as stable.
    odd = h.request_of(http, {"user": "ann", "q": 1}, "uid:1:call é\r\n:abc")
    key = dict(odd.headers)["Idempotency-Key"]
    assert key.startswith("sha256-") and len(key) == 7 + 64
    again = h.request_of(http, {"user": "x", "q": 1}, "uid:1:call é\r\n:abc")
    assert key == dict(again.headers)["Idempotency-Key"]


def test_a_reserved_header_is_never_set_by_the_tool() -> None:
    http = _http(headers=[{"name": "idempotency-key", "value": "mine"}])
    with pytest.raises(h.Refused, match="may not set the header idempotency-key"):
        h.request_of(http, {"user": "ann", "q": 1}, "k")


# -- checks of a call and of a declaration ---------------------------------------------------


def test_a_call_problem_names_what_is_wrong_and_none_when_it_may_run() -> None:
    http = _http()
    assert h.call_problem(http, {"user": "ann", "q": "x"}) is None
    assert h.call_problem(http, {"q": "x"}) == "the URL needs the argument user"


def test_a_declaration_that_takes_an_undeclared_argument_or_names_another_host_is_a_problem() -> (
    None
):
    assert h.declaration_problems(_tool()) == []
    wrong = _tool(url="https://elsewhere.example/{who}", body=None)
    problems = h.declaration_problems(wrong)
    assert any("takes the arguments who" in p for p in problems), problems
    assert any("elsewhere.example:443 is not among" in p for p in problems), problems
    body = _tool(method="POST", body={"template": {"x": "{missing}", "{key}": "{note}"}})
    assert h.declaration_problems(body) == [
        "the HTTP tool lookup takes the arguments missing, which its parameters do not declare "
        "(properties)"
    ]
    # A host made of an argument is checked per call.
    assert h.declaration_problems(_tool(url="https://{user}.allowed.example/{q}")) == []


# -- what the model reads --------------------------------------------------------------------


def test_a_response_is_recorded_with_its_secrets_replaced_and_a_non_2xx_is_an_error() -> None:
    secrets = {"Authorization": "Bearer s3cret-token"}
    ok = h.response_record(
        200, "OK", "application/json", b'{"echo": "Bearer s3cret-token"}', False, secrets, "u"
    )
    assert ok == {
        "status": 200,
        "reason": "OK",
        "url": "u",
        "contentType": "application/json",
        "body": '{"echo": "[the value of header Authorization]"}',
    }
    assert h.result_summary(ok).startswith("HTTP 200 OK: {")
    missing = h.response_record(404, "Not Found", None, b"no such user", True, {}, "u")
    assert missing["error"] == "the server answered HTTP 404 Not Found"
    assert missing["truncated"] is True
    assert h.result_summary(missing) == "error: HTTP 404 Not Found: no such user"
    moved = h.response_record(302, "Found", None, b"", False, {}, "u", not_followed="it goes")
    assert moved["error"].endswith("its redirect was not followed: it goes")
    assert "\ufffd" in h.response_record(200, "OK", None, b"\xff", False, {}, "u")["body"]
