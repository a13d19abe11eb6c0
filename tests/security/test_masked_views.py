"""Issue 35 §6 against real processes: a run whose step returned a client secret and wrote a
provider key to its stream, executed by a real `perdure worker`, is shown masked by every
view: the run-output stream of `perdure serve`, `perdure tail`, `perdure explain` (table and
JSON; the secret used to show inside the step's returned value) and `perdure audit` (a
comment quoting a key, a resolve value holding a client secret; table and JSON) as
`GET /api/v1/audit` does. One redactor (`observe.redact`) masks them all."""

from __future__ import annotations

import time

from sec_app import CLIENT_SECRET, PROVIDER_KEY
from served import Served, perdure, worker


def finished_leaky_run(serve: Served) -> str:
    """The id of a `leaky` run a real worker completed."""
    with serve.client("operate") as api, worker(serve.env, serve.log.with_name("worker.log")):
        assert api.post("/api/v1/runs", json={"workflow": "leaky", "id": "leaky"}).is_success
        deadline = time.monotonic() + 60
        while api.get("/api/v1/runs/leaky").json()["status"] != "completed":
            assert time.monotonic() < deadline, "the worker never completed the run"
            time.sleep(0.2)
    return "leaky"


def test_streams_and_explain_mask_what_a_step_wrote_and_returned(serve: Served) -> None:
    run_id = finished_leaky_run(serve)
    with serve.client("read") as api:
        streamed = api.get(f"/api/v1/runs/{run_id}/stream").text
        explained = api.get(f"/api/v1/runs/{run_id}/explain").text
    tail = perdure(serve.env, "tail", run_id).stdout
    table = perdure(serve.env, "explain", run_id, "--wide").stdout
    as_json = perdure(serve.env, "explain", run_id, "--json").stdout
    for shown in (streamed, tail):
        assert "event: end" in streamed and "using sk-***" in shown, shown
        assert PROVIDER_KEY not in shown, shown
    for shown in (explained, table, as_json):
        assert "client_secret" in shown and CLIENT_SECRET not in shown, shown
    assert "perdure" in table  # the rest of the returned value is shown as it was


def test_perdure_audit_masks_a_key_quoted_in_a_comment(serve: Served) -> None:
    with serve.client("operate") as api:
        assert api.post("/api/v1/runs", json={"workflow": "waits", "id": "calm"}).is_success
        comment = f"rotated {PROVIDER_KEY}; client_secret={CLIENT_SECRET}"
        assert api.post("/api/v1/runs/calm/cancel", json={"comment": comment}).is_success
        from_api = api.get("/api/v1/audit").text
    table = perdure(serve.env, "audit", "--wide").stdout
    as_json = perdure(serve.env, "audit", "--json").stdout
    for shown in (from_api, table, as_json):
        assert "rotated sk-***" in shown, shown
        assert PROVIDER_KEY not in shown and CLIENT_SECRET not in shown, shown


def test_a_resolve_value_is_masked_in_the_audit_api_and_perdure_audit(serve: Served) -> None:
    """A step's crash left the run for a person (a real worker died inside a `once` step);
    the value an operator resolves it with quotes a client secret and a key: both views of
    the audit log mask them."""
    crashing = {**serve.env, "CRASH_IN_CHARGE": "1"}
    with serve.client("operate") as api:
        assert api.post("/api/v1/runs", json={"workflow": "charges", "id": "paid"}).is_success
        with worker(crashing, serve.log.with_name("crashed.log")) as crashed:
            assert crashed.wait(60) == 3  # died inside the step
        with worker(serve.env, serve.log.with_name("worker.log")):
            deadline = time.monotonic() + 60
            while api.get("/api/v1/runs/paid").json()["status"] != "needs_attention":
                assert time.monotonic() < deadline, "the crashed run was never parked"
                time.sleep(0.2)
            value = {"receipt": "r-1", "client_secret": CLIENT_SECRET, "note": PROVIDER_KEY}
            resolved = api.post("/api/v1/runs/paid/resolve", json={"step": 0, "value": value})
            assert resolved.is_success, resolved.text
        from_api = api.get("/api/v1/audit").json()["entries"]
    [entry] = [e for e in from_api if e["action"] == "run.resolve"]
    assert entry["detail"]["value"] == {"receipt": "r-1", "client_secret": "***",
                                        "note": "sk-***"}  # fmt: skip
    for shown in (perdure(serve.env, "audit", "--json").stdout,
                  perdure(serve.env, "audit", "--wide").stdout):  # fmt: skip
        assert "r-1" in shown and CLIENT_SECRET not in shown and PROVIDER_KEY not in shown
