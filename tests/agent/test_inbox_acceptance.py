"""The inbox agent's acceptance: an answer is checked against its file before it is written,
a rejected one is fed back and retried, then escalated; no tier passing fails the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import perdure
from perdure.agent.loop import Agent
from perdure.agent.providers.scripted import ScriptedModel, extractive_summary
from perdure.agent.spec import load_spec
from perdure.errors import RunFailed
from perdure.testing import TestWorker

ROOT = Path(__file__).resolve().parents[2]
NOTES = (
    "Weekly planning, 14 November. Ana chaired. The team agreed to ship the billing export "
    "before 30 November; Ben owns the migration.\n"
)
GOOD = "On 14 November the team agreed to ship the billing export before 30 November."
INVENTED = "On 12 March 2023 Carla cancelled the billing export."
INVENTED_TOO = "On 3 May Carla moved the billing export to 2027."


def facts_first(spec: str) -> str:
    """The shipped spec (one model call a file) with the facts-first pipeline turned on."""
    assert "facts_first = false" in spec
    return spec.replace("facts_first = false", "facts_first = true", 1)


def make(
    app: perdure.App, tmp_path: Path, local: list[object], notes: str = "task"
) -> tuple[Agent, ScriptedModel]:
    """The shipped inbox spec in tmp_path, its local tier scripted by `local`."""
    text = (ROOT / "examples/inbox/agent.toml").read_text()
    (tmp_path / "agent.toml").write_text(text.replace('notes = "task"', f'notes = "{notes}"'))
    (tmp_path / "inbox").mkdir()
    model = ScriptedModel(local)  # type: ignore[arg-type]
    providers = {"local": model, "extractive": ScriptedModel(responder=extractive_summary)}
    return Agent(app.runtime, load_spec(tmp_path / "agent.toml"), providers=providers), model


def drop(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / "inbox" / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


def verdicts(app: perdure.App, run_id: str) -> list[dict[str, object]]:
    """The journaled grounding verdicts of a run, in order."""
    entries = app.runtime.sync(app.runtime.store.journal(run_id), "journal")

    return [
        json.loads(e.data or "{}")["value"]
        for e in entries
        if e.kind == "step.outcome" and e.name.endswith(".ground")
    ]


def test_a_grounded_answer_is_written_and_names_its_tier(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The first answer holds: written once, with the tier that wrote it."""
    agent, model = make(app, tmp_path, [GOOD])
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    result = handle.result(timeout=5)
    assert result["tier"] == "local" and result["rejections"] == 0
    written = (tmp_path / "outbox/notes_summary.md").read_text()
    assert GOOD in written and "model tier local (local:" in written
    assert [v["ok"] for v in verdicts(app, "r")] == [True]
    assert model.calls == 1


def test_a_rejected_answer_is_fed_back_then_the_next_tier_writes(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """Two invented answers from the local tier, then the extractive tier's grounded one."""
    agent, model = make(app, tmp_path, [INVENTED, INVENTED_TOO])
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    result = handle.result(timeout=5)
    assert result["tier"] == "extractive" and result["rejections"] == 2
    assert model.calls == 2  # retried once within the tier, then escalated
    feedback = model.requests[1].messages[-1].content
    assert "not accepted" in feedback and "'2023'" in feedback and "'Carla'" in feedback
    written = (tmp_path / "outbox/notes_summary.md").read_text()
    assert "Carla" not in written and "model tier extractive" in written
    assert [v["ok"] for v in verdicts(app, "r")] == [False, False, True]


def test_a_retry_that_returns_the_same_answer_is_not_checked_again(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The model says its rejected answer again: the next tier answers at once, and the
    repeat is neither checked nor shown to it."""
    agent, model = make(app, tmp_path, [INVENTED, INVENTED, GOOD])
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    result = handle.result(timeout=5)
    assert result["tier"] == "extractive" and result["rejections"] == 2
    assert model.calls == 2
    assert [v["ok"] for v in verdicts(app, "r")] == [False, True]


NOT_SUMMARIES = {  # what small models answered instead of a summary (issue 33)
    "copy": "Weekly planning, 14 November. Ana chaired. The team agreed to ship the billing",
    "title": "Weekly planning, 14 November",
    "greeting": "Hi Ana, the team agreed to ship the billing export before 30 November.",
    "refusal": "I'm sorry, but I'm unable to provide a summary of this document.",
    "fact-free": "The team talked about work and agreed on a plan for the next weeks.",
    "echo": "The answer was not accepted because it is not grounded in the source.",
}


def test_no_copy_title_greeting_refusal_echo_or_fact_free_answer_reaches_the_outbox(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The local tier answers with each non-summary in turn, no other tier: every one is
    rejected with its reason journaled and fed back, and nothing is written."""
    text = (ROOT / "examples/inbox/agent.toml").read_text()
    text = text.replace("escalate_after_failures = 2", "escalate_after_failures = 6")
    (tmp_path / "agent.toml").write_text(text.replace("max_iterations = 4", "max_iterations = 6"))
    (tmp_path / "inbox").mkdir()
    model = ScriptedModel(list(NOT_SUMMARIES.values()))
    agent = Agent(app.runtime, load_spec(tmp_path / "agent.toml"),
                  providers={"local": model, "extractive": ScriptedModel([])})  # fmt: skip
    long_notes = NOTES + "Ben said the migration needs two more weeks of testing on staging.\n"
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", long_notes), run_id="r")
    worker.run_until_idle()
    with pytest.raises(RunFailed, match="6 iterations without meeting the acceptance"):
        handle.result(timeout=5)
    assert not (tmp_path / "outbox").exists() or not list((tmp_path / "outbox").iterdir())
    reasons = [str(v["evidence"]) for v in verdicts(app, "r")]
    expected = ["copies the file", "no whole sentence", "greeting", "refusal",
                "names nothing of the file's facts", "repeats the feedback"]  # fmt: skip
    assert len(reasons) == len(expected)
    for reason, want in zip(reasons, expected, strict=True):
        assert want in reason, (want, reason)
    fed_back = [r.messages[-1].content for r in model.requests[1:]]
    assert all("not accepted" in f for f in fed_back) and "greeting" in fed_back[2]


@pytest.mark.parametrize("garbage", ["", "   ", "ok", "Zorblax 9000 QQQ!!"])
def test_an_empty_or_garbage_answer_is_rejected_and_escalated(
    app: perdure.App, worker: TestWorker, tmp_path: Path, garbage: str
) -> None:
    """Nothing, a word or noise from the model never lands in outbox/."""
    agent, _ = make(app, tmp_path, [garbage, garbage])
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    assert handle.result(timeout=5)["tier"] == "extractive"
    written = (tmp_path / "outbox/notes_summary.md").read_text()
    assert "Weekly planning, 14 November." in written


def test_no_tier_passing_fails_the_run_and_writes_nothing(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """When every tier's answer is refused, the run fails with the evidence, no file."""
    agent, _ = make(app, tmp_path, [INVENTED] * 2)
    agent.providers["extractive"] = ScriptedModel([INVENTED] * 2)
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    with pytest.raises(RunFailed, match="not in the source"):
        handle.result(timeout=5)
    assert not (tmp_path / "outbox/notes_summary.md").exists()


def test_an_answer_cut_off_before_a_whole_sentence_is_never_accepted(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """stop_reason "length" with no whole sentence is refused even when every claim it
    makes is grounded."""
    cut = {"content": GOOD.removesuffix("."), "stop_reason": "length"}
    agent, _ = make(app, tmp_path, [cut, GOOD])
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    assert handle.result(timeout=5)["rejections"] == 1
    assert "cut off" in str(verdicts(app, "r")[0]["evidence"])


def test_one_files_progress_notes_never_reach_another_files_prompt(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """notes = "task": the second file's prompt holds no line about the first file."""
    agent, model = make(app, tmp_path, [GOOD, "The file says hello to Ana."])
    app.start(agent.workflow, drop(tmp_path, "a.txt", NOTES), run_id="a")
    worker.run_until_idle()
    app.start(agent.workflow, drop(tmp_path, "b.txt", "Ana says hello.\n"), run_id="b")
    worker.run_until_idle()
    assert "a.txt" not in model.requests[1].messages[0].content
    assert "Progress notes" not in model.requests[1].messages[0].content


def test_shared_notes_reach_every_run_when_the_spec_asks(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """notes = "agent": the earlier file's note is in the next prompt."""
    agent, model = make(app, tmp_path, [GOOD, "The file says hello to Ana."], notes="agent")
    app.start(agent.workflow, drop(tmp_path, "a.txt", NOTES), run_id="a")
    worker.run_until_idle()
    app.start(agent.workflow, drop(tmp_path, "b.txt", "Ana says hello.\n"), run_id="b")
    worker.run_until_idle()
    assert "a.txt" in model.requests[1].messages[0].content


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "is empty"), (b"  \n\n", "is empty"), (b"\x00\x01PNG\x00" * 50, "is not text")],
)
def test_an_empty_or_binary_file_fails_in_one_line_without_a_model_call(
    app: perdure.App, worker: TestWorker, tmp_path: Path, content: bytes, message: str
) -> None:
    """Nothing about such a file could be checked: the run fails at once, the model unasked."""
    agent, model = make(app, tmp_path, [GOOD])
    handle = app.start(agent.workflow, drop(tmp_path, "x.txt", content), run_id="r")
    worker.run_until_idle()
    with pytest.raises(RunFailed, match=message) as failed:
        handle.result(timeout=5)
    assert "\n" not in str(failed.value)
    assert model.calls == 0


def test_a_huge_file_is_cut_to_the_first_tiers_context_and_says_so(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """A file far beyond the local tier's context is shown in part, with a marker."""
    agent, model = make(app, tmp_path, [GOOD])
    big = NOTES + ("The weather was fine and nothing else happened that day. " * 4000)
    handle = app.start(agent.workflow, drop(tmp_path, "big.txt", big), run_id="r")
    worker.run_until_idle()
    prompt = model.requests[0].messages[1].content
    assert "[... the first" in prompt and len(prompt) < 6500
    assert handle.result(timeout=5)["tier"] == "local"


def test_a_long_chinese_file_is_cut_by_tokens_not_characters(tmp_path: Path) -> None:
    """A CJK character is about a token: such a file is cut far shorter than Latin text."""
    from perdure.agent.budgets import estimate_tokens
    from perdure.agent.loop import task_text

    path = tmp_path / "zh.txt"
    path.write_text("会议于11月14日举行，预算为3000元。\n" * 400)
    text = task_text(path, 1000)
    assert "[... the first" in text and estimate_tokens(text.split("\n[...")[0]) <= 1000
    assert len(text) < 1600  # Latin text of 1,000 tokens would be about 3,300 characters


def test_facts_first_lists_checks_then_writes_from_the_checked_facts(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The first call lists the facts; an invented one is dropped (journaled with why),
    the checked ones follow the file in the call that writes the summary, which begins as
    the first did (the model server's prompt cache reads the file once)."""
    text = (ROOT / "examples/inbox/agent.toml").read_text()
    (tmp_path / "agent.toml").write_text(facts_first(text))
    (tmp_path / "inbox").mkdir()
    listed = "- Ana chaired on 14 November.\n- Carla owns the export.\n- Ben owns the migration."
    model = ScriptedModel([listed, GOOD])
    agent = Agent(app.runtime, load_spec(tmp_path / "agent.toml"),
                  providers={"local": model, "extractive": ScriptedModel([])})  # fmt: skip
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    assert handle.result(timeout=5)["answer"] == GOOD
    assert "List the key facts" in model.requests[0].messages[1].content
    asked = model.requests[1].messages[1].content
    assert "- Ana chaired on 14 November." in asked and "- Ben owns the migration." in asked
    first, second = model.requests[0].messages, model.requests[1].messages
    assert first[0] == second[0]  # one system message for both calls
    file_part = first[1].content.split("List the key facts")[0]
    assert "File notes.txt:" in file_part and asked.startswith(file_part)
    assert asked.index("- Ana chaired") > asked.index(NOTES.strip()[:40])
    assert "Carla" not in asked
    entries = app.runtime.sync(app.runtime.store.journal("r"), "journal")
    [facts] = [json.loads(e.data or "{}")["value"] for e in entries
               if e.kind == "step.outcome" and e.name.endswith(".facts")]  # fmt: skip
    assert facts["dropped"] == [{"fact": "Carla owns the export.", "why": "not in the file: Carla"}]
    # the checked facts the summary leaves out follow it in the output; none invented
    written = (tmp_path / "outbox/notes_summary.md").read_text()
    body = written.split("\n---\n")[0]
    assert f"{GOOD}\n\nKey facts:\n- Ana chaired on 14 November.\n- Ben owns the migration." in body
    assert "Carla" not in written


def test_a_facts_list_cut_off_at_max_tokens_loses_only_its_half_line(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """The facts call stopped at its token limit: its last line is half a fact and is not
    used; the whole lines before it are."""
    (tmp_path / "agent.toml").write_text(
        facts_first((ROOT / "examples/inbox/agent.toml").read_text())
    )
    (tmp_path / "inbox").mkdir()
    listed = "- Ana chaired on 14 November.\n- Ben owns the migration.\n- The team agreed to"
    model = ScriptedModel([{"content": listed, "stop_reason": "length"}, GOOD])
    agent = Agent(app.runtime, load_spec(tmp_path / "agent.toml"),
                  providers={"local": model, "extractive": ScriptedModel([])})  # fmt: skip
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    assert handle.result(timeout=5)["answer"] == GOOD
    asked = model.requests[1].messages[1].content
    assert "- Ben owns the migration." in asked and "- The team agreed to" not in asked
    assert model.requests[0].max_tokens is not None and model.requests[0].max_tokens <= 120


def test_an_answer_cut_off_at_the_token_limit_is_written_up_to_its_last_whole_sentence(
    app: perdure.App, worker: TestWorker, tmp_path: Path
) -> None:
    """No second call for an answer that ran long: its whole sentences are checked and
    written; the half sentence is not."""
    cut = f"{GOOD} Ben owns the migration and will"
    agent, _ = make(app, tmp_path, [{"content": cut, "stop_reason": "length"}])
    handle = app.start(agent.workflow, drop(tmp_path, "notes.txt", NOTES), run_id="r")
    worker.run_until_idle()
    result = handle.result(timeout=5)
    assert result["answer"] == GOOD and result["iterations"] == 1
    written = (tmp_path / "outbox/notes_summary.md").read_text()
    assert GOOD in written and "and will" not in written
