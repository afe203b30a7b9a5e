"""Job ids, callback URLs and list cursors a client forges, on PostgreSQL (the `client`
fixture: real PostgreSQL and Redis, the distributed setup) and on the embedded setup
(SQLite, the folder broker): a 4xx with a contract code everywhere, never a 500.

Found by an attack run: a NUL byte in `callback_url` or in the job id of any
`/v1/exports/{id}…` path was a 500 on PostgreSQL (`psycopg.DataError`: PostgreSQL text
cannot hold NUL), and forged cursors (year 1 at +14:00, year 9999 at -14:00) were a 500
on every setup (their UTC time is out of `datetime`'s range).
"""

from __future__ import annotations

import base64
import json

import pytest
from fastapi.testclient import TestClient

from schemas.errors import ErrorBody
from tests.service.conftest import model_file

JOB_PATHS = ("", "/events", "/artifacts/program.pt2", "/uploads/model", "/uploads/model/files/a.py")


def _code(answer: object) -> str:
    return ErrorBody.model_validate(answer.json()).code  # type: ignore[attr-defined]


def _cursor(created: str, job_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created}|{job_id}".encode()).decode().rstrip("=")


@pytest.mark.parametrize("job_id", ["a%00b", "%00", "00000000-0000-0000-0000-00000000000%00"])
@pytest.mark.parametrize("suffix", JOB_PATHS)
def test_a_nul_byte_in_a_job_id_is_not_found(
    any_setup: TestClient, job_id: str, suffix: str
) -> None:
    answer = any_setup.get(f"/v1/exports/{job_id}{suffix}")
    assert answer.status_code == 404
    assert _code(answer) == "not_found"


def test_a_nul_byte_in_a_job_id_cannot_be_canceled(any_setup: TestClient) -> None:
    answer = any_setup.delete("/v1/exports/a%00b")
    assert answer.status_code == 404
    assert _code(answer) == "not_found"


@pytest.mark.parametrize(
    "url", ["https://example.com/\x00hook", "http://\x00/", "https://example.com/a\x1fb"]
)
def test_control_characters_in_callback_url_are_invalid(any_setup: TestClient, url: str) -> None:
    as_form = {"callback_url": url}
    as_option = {"options": json.dumps({"callback_url": url})}
    for data in (as_form, as_option):  # the deprecated option is the job's callback_url
        answer = any_setup.post("/v1/exports", files={"model": model_file()}, data=data)
        assert answer.status_code == 400, answer.text
        body = ErrorBody.model_validate(answer.json())
        assert body.code == "invalid_request"
        assert [e["field"] for e in body.details["errors"]] == ["callback_url"]


@pytest.mark.parametrize(
    "cursor",
    [
        _cursor("0001-01-01T00:00:00+14:00", "00000000-0000-0000-0000-000000000000"),
        _cursor("9999-12-31T23:59:59-14:00", "ffffffff-ffff-ffff-ffff-ffffffffffff"),
        _cursor("2026-01-01T00:00:00+00:00", "a\x00b"),
        _cursor("2026-01-01T00:00:00", "00000000-0000-0000-0000-000000000000"),
    ],
)
def test_forged_cursors_are_invalid_requests(any_setup: TestClient, cursor: str) -> None:
    answer = any_setup.get("/v1/exports", params={"cursor": cursor})
    assert answer.status_code == 400
    body = ErrorBody.model_validate(answer.json())
    assert body.code == "invalid_request"
    assert body.details["field"] == "cursor"


def test_a_cursor_of_the_list_still_pages(any_setup: TestClient) -> None:
    ids = [
        any_setup.post("/v1/exports", files={"model": ("m.py", f"model = {i}\n".encode())}).json()[
            "id"
        ]
        for i in range(3)
    ]
    first = any_setup.get("/v1/exports", params={"limit": 2}).json()
    second = any_setup.get(
        "/v1/exports", params={"limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert [j["id"] for j in first["items"] + second["items"]] == ids[::-1]
    assert second["next_cursor"] is None
