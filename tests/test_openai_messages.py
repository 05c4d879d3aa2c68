"""OpenAI-format messages: chats in ``{"messages": [...]}`` records, agent turns whose output is a tool
call, and trajectories one a line. Old: a ``.jsonl`` of ``{"messages"}`` chats was read as a token trace
("field 'session_id': missing"); an assistant message with ``"content": null`` and ``tool_calls`` became
a near-empty output, and every later call's input lost the call; a ``.jsonl`` of trajectories was
refused ("invalid JSON: Extra data")."""

from __future__ import annotations

import json

import pytest

from marconi.cli import main
from marconi.core.registry import ConfigError
from marconi.workloads import build_workload, load_trace
from marconi.workloads.messages import Message
from marconi.workloads.raw import raw_source_of
from marconi.workloads.sharegpt import build_chat_trace, read_chat_records
from marconi.workloads.swe import build_swe_trace, load_trajectories


def _chat(k: int, turns: int = 3) -> list[dict]:
    out = [{"role": "developer" if k % 2 else "system", "content": "You are a helpful assistant."}]
    for t in range(turns):
        out += [{"role": "user", "content": f"question {k}.{t} " * 5},
                {"role": "assistant", "content": f"answer {k}.{t} " * 7}]
    return out


def _call(i: int) -> dict:
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"grep -rn needle_{i} src/"})}}


def _agent(k: int, content: str | None = None) -> list[dict]:
    out = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": f"issue {k} " * 20}]
    for i in range(4):
        out += [{"role": "assistant", "content": content, "tool_calls": [_call(i)]},
                {"role": "tool", "tool_call_id": f"call_{i}", "content": f"match {k}.{i} " * 10}]
    return out


def _tokens(trace) -> list[tuple[list[int], list[int]]]:
    return [(r.input_tokens.tolist(), r.output_tokens.tolist()) for r in trace]


def test_a_jsonl_of_openai_chats_is_the_chat_recipe_and_equals_the_same_chats_as_sharegpt(tmp_path):
    chats = tmp_path / "held_out_chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": _chat(k)}) + "\n" for k in range(4)))
    same = tmp_path / "same.json"           # ShareGPT's field, the same role/content messages
    same.write_text(json.dumps([{"conversations": _chat(k)} for k in range(4)]))
    assert raw_source_of(chats) == "sharegpt"
    records = list(read_chat_records([chats]))
    assert records[1].messages[0].raw["role"] == "developer" and records[1].messages[0].role == "system"
    trace = build_workload(f"sharegpt:files={chats},min_rounds=1")
    assert len(trace) == 12 and trace.meta["num_sessions"] == 4
    assert _tokens(trace) == _tokens(build_workload(f"sharegpt:files={same},min_rounds=1"))
    # given as the trace itself, it is built by that recipe; with the paper's filter (>= 20 messages)
    # nothing qualifies, and the refusal names the setting that loosens it
    with pytest.raises(Exception, match="min_rounds"):
        load_trace(str(chats))


def test_a_chat_turn_that_is_only_a_tool_call_is_read(tmp_path):
    """OpenAI's format lets an assistant message carry ``tool_calls`` and no ``content`` at all."""
    msgs = [{"role": "user", "content": "what time is it"}, {"role": "assistant", "tool_calls": [_call(0)]},
            {"role": "tool", "tool_call_id": "call_0", "content": "12:00"}, {"role": "assistant", "content": "noon"}]
    path = tmp_path / "calls.jsonl"
    path.write_text(json.dumps({"messages": msgs}) + "\n")
    (record,) = read_chat_records([path])
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    assert record.messages[1].content == "" and "needle_0" in record.messages[1].text("json")
    no_content = tmp_path / "no_content.jsonl"
    no_content.write_text(json.dumps({"messages": [{"role": "assistant"}]}) + "\n")
    with pytest.raises(ValueError, match=r"no_content\.jsonl:1: message 0: a message needs from/role and "
                                         r"value/content"):
        list(read_chat_records([no_content]))


def test_content_parts_are_read_as_their_text(tmp_path):
    parts = [{"role": "user", "content": [{"type": "text", "text": "look "}, {"type": "image_url", "image_url": {}},
                                          {"type": "text", "text": "here"}]},
             {"role": "assistant", "content": "seen"}]
    path = tmp_path / "parts.jsonl"
    path.write_text(json.dumps({"messages": parts}) + "\n")
    (record,) = read_chat_records([path])
    assert [m.content for m in record.messages] == ["look here", "seen"]


def test_bare_messages_with_a_tool_role_or_call_are_an_agents_trajectory(tmp_path):
    agent = tmp_path / "agent.json"
    agent.write_text(json.dumps([{"messages": _agent(0)}]))
    assert raw_source_of(agent) == "swe"
    only_call = tmp_path / "only_call.json"          # a call, and the observation in a user message
    msgs = [m if m["role"] != "tool" else {"role": "user", "content": m["content"]} for m in _agent(0)]
    only_call.write_text(json.dumps({"messages": msgs}))
    assert raw_source_of(only_call) == "swe"


@pytest.mark.parametrize("text_form", ["json", "content"])
def test_a_tool_call_is_part_of_the_output_and_of_every_later_input(tmp_path, text_form):
    with_call = tmp_path / "with_call.json"
    with_call.write_text(json.dumps([{"instance_id": "a", "messages": _agent(0)}]))
    without = tmp_path / "without.json"
    without.write_text(json.dumps([{"instance_id": "a", "messages": [
        {k: v for k, v in m.items() if k != "tool_calls"} for m in _agent(0)]}]))
    calls = build_swe_trace([with_call], keep_observations=None, text_form=text_form)
    bare = build_swe_trace([without], keep_observations=None, text_form=text_form)
    assert len(calls) == len(bare) == 4
    for c, b in zip(calls, bare):
        # each output carries its call (the command's text is in it), so each later input is longer too
        assert len(c.output_tokens) > len(b.output_tokens) + 10
    assert all(len(c.input_tokens) > len(b.input_tokens) for c, b in list(zip(calls, bare))[1:])
    (traj,) = load_trajectories([with_call])
    call = traj.messages[2]
    assert call.role == "assistant" and call.content == ""
    assert "grep -rn needle_0 src/" in json.loads(call.text("json"))["tool_calls"][0]["function"]["arguments"]
    assert "needle_0" in call.text("content")


def test_a_message_without_calls_reads_as_before():
    plain = Message("assistant", "hello", {"role": "assistant", "content": "hello"})
    assert plain.text("json") == '{"role": "assistant", "content": "hello"}'
    assert plain.text("content") == "hello"


def test_a_jsonl_of_trajectories_is_read_one_a_line_as_the_same_array(tmp_path):
    records = [{"instance_id": f"i{k}", "messages": _agent(k, content=f"thinking {k}")} for k in range(3)]
    array = tmp_path / "trajs.json"
    array.write_text(json.dumps(records))
    lines = tmp_path / "trajs.jsonl"
    lines.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert raw_source_of(lines) == "swe"
    assert _tokens(load_trace(str(lines))) == _tokens(load_trace(str(array)))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records[0]) + "\n" + json.dumps({"instance_id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2.*no 'messages' or 'history'"):
        build_workload(f"swe:files={bad}")


def test_sharegpt_style_tool_data_reads_the_call_as_the_models_turn(tmp_path):
    """LLaMA-Factory's ShareGPT format: ``human``, ``function_call`` (the model's), ``observation``
    (the tool's), ``gpt``. Old: "unknown message role 'function_call'"."""
    convo = [{"from": "human", "value": "weather in Paris?"},
             {"from": "function_call", "value": json.dumps({"name": "weather", "arguments": {"city": "Paris"}})},
             {"from": "observation", "value": "18C, cloudy"}, {"from": "gpt", "value": "18C and cloudy."}]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"conversations": convo}]))
    (record,) = read_chat_records([path])
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    trace = build_workload(f"sharegpt:files={path},min_rounds=1")
    assert [len(r.output_tokens) > 0 for r in trace] == [True, True]    # the call, then the answer


def test_a_file_of_one_conversation_is_one_record(tmp_path):
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"messages": _chat(0)}))
    assert raw_source_of(one) == "sharegpt"
    assert len(build_workload(f"sharegpt:files={one},min_rounds=1")) == 3
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"notes": []}))
    with pytest.raises(ValueError, match=r"other\.json: expected a JSON list of conversation records, got an object"):
        list(read_chat_records([other]))


# ----------------------------------------------------------------- what an audit of held-out formats found
def _stats(path, capsys) -> tuple[int, str]:
    code = main(["trace", "stats", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_lone_surrogate_is_read_not_a_traceback(tmp_path):
    """JSON allows ``\\ud800``; no tokenizer encodes it. Old: a TypeError traceback (content form)."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "bad \ud800 x"},
                                             {"role": "assistant", "content": "ok"}]}) + "\n")
    for form in ("json", "content"):
        trace = build_chat_trace([path], min_rounds=1, text_form=form)
        assert len(trace) == 1


def test_content_parts_never_tokenize_an_images_bytes_and_read_tool_blocks(tmp_path):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 20000}}
    parts = tmp_path / "parts.jsonl"
    parts.write_text(json.dumps({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is in "}, image,
                                     {"type": "text", "text": "this?"}]},
        {"role": "assistant", "content": "a cat"}]}) + "\n")
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"messages": [{"role": "user", "content": "What is in this?"},
                                              {"role": "assistant", "content": "a cat"}]}) + "\n")
    spec = "sharegpt:files={},min_rounds=1"
    assert _tokens(build_workload(spec.format(parts))) == _tokens(build_workload(spec.format(plain)))
    # Anthropic's tool blocks and the Assistants API's text parts are text the model read or wrote
    msgs = [{"role": "user", "content": "fix it"},
            {"role": "assistant", "content": [{"type": "text", "text": "Looking."},
                                              {"type": "tool_use", "id": "t", "name": "bash",
                                               "input": {"command": "cat needle.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": [{"type": "text", "text": "def needle(): pass"}]}]},
            {"role": "assistant", "content": [{"type": "text", "text": {"value": "Found it."}}]}]
    blocks = tmp_path / "blocks.jsonl"
    blocks.write_text(json.dumps({"messages": msgs}) + "\n")
    assert raw_source_of(blocks) == "swe"                       # a tool's use and result: an agent
    (traj,) = load_trajectories([blocks])
    texts = [m.content for m in traj.messages]
    assert "cat needle.py" in texts[1] and texts[2] == "def needle(): pass" and texts[3] == "Found it."


def test_a_records_own_system_prompt_and_tools_are_its_shared_prefix(tmp_path):
    convo = [{"from": "human", "value": "weather?"}, {"from": "gpt", "value": "sunny"}]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    with_them = tmp_path / "with.jsonl"
    with_them.write_text(json.dumps({"conversations": convo, "system": "You are a forecaster. " * 20,
                                     "tools": tools}) + "\n")
    without = tmp_path / "without.jsonl"
    without.write_text(json.dumps({"conversations": convo}) + "\n")
    (record,) = read_chat_records([with_them])
    assert [m.role for m in record.messages] == ["system", "system", "user", "assistant"]
    assert "forecaster" in record.messages[0].content and json.loads(record.messages[1].content) == tools
    spec = "sharegpt:files={},min_rounds=1"
    (a,), (b,) = build_workload(spec.format(with_them)), build_workload(spec.format(without))
    assert len(a.input_tokens) > len(b.input_tokens) + 100 and a.output_tokens.tolist() == b.output_tokens.tolist()


def test_swe_smith_and_nebius_trajectories_are_read(tmp_path):
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "fix x"},
            {"role": "assistant", "content": "done"}]
    smith = tmp_path / "smith.jsonl"          # SWE-smith stores the messages as a JSON string
    smith.write_text(json.dumps({"instance_id": "a__b-1", "traj_id": "t", "messages": json.dumps(msgs)}) + "\n")
    nebius = tmp_path / "nebius.jsonl"        # nebius's SWE-agent exports: trajectory, role "ai", text
    nebius.write_text(json.dumps({"instance_id": "a__b-1", "exit_status": "submitted", "trajectory": [
        {"role": m["role"].replace("assistant", "ai"), "text": m["content"]} for m in msgs]}) + "\n")
    assert raw_source_of(smith) == raw_source_of(nebius) == "swe"
    (s,), (n,) = load_trajectories([smith]), load_trajectories([nebius])
    assert s.name == n.name == "a__b-1"
    assert [(m.role, m.content) for m in s.messages] == [(m.role, m.content) for m in n.messages]
    assert [m.role for m in s.messages] == ["system", "user", "assistant"]


def test_a_null_field_does_not_hide_its_twin(tmp_path):
    """A table uniting ShareGPT's and the OpenAI format's rows has from/value and role/content, one
    pair null. Old: "unknown message role None", or the content silently lost."""
    path = tmp_path / "union.jsonl"
    path.write_text(json.dumps({"conversations": [
        {"from": None, "value": None, "role": "user", "content": "real text"},
        {"from": "gpt", "value": "reply", "role": None, "content": None}]}) + "\n")
    (record,) = read_chat_records([path])
    assert [(m.role, m.content) for m in record.messages] == [("user", "real text"), ("assistant", "reply")]


def test_trajectories_without_ids_keep_their_order_and_a_first_assistant_message_is_history(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "assistant", "content": "hello, I am ready"}]
                                        + _agent(k, content=f"step {k}")}) + "\n" for k in range(12)))
    trace = build_swe_trace([path], num_sessions=3)
    assert trace.meta["source_ids"] == ["runs[1]", "runs[2]", "runs[3]"]       # not runs[10], runs[11], ...
    assert all(len(r.input_tokens) > 0 for r in trace) and len(trace) == 3 * 4


def test_a_non_finite_created_time_names_its_message(tmp_path):
    path = tmp_path / "t.json"
    msgs = _agent(0, content="x")
    msgs[2]["created"] = float("nan")
    path.write_text(json.dumps([{"instance_id": "n", "messages": msgs}]))
    with pytest.raises(ValueError, match=r"t\.json: trajectory 'n' message 2: 'created' must be a unix time"):
        load_trajectories([path])


def test_json_files_with_a_bom_or_a_huge_integer(tmp_path, capsys):
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"messages": _chat(0)}]).encode())
    assert raw_source_of(bom) == "sharegpt"
    assert len(build_workload(f"sharegpt:files={bom},min_rounds=1")) == 3
    huge = tmp_path / "huge.json"
    huge.write_text('[{"messages": [{"role": "user", "content": "x", "n": ' + "9" * 5000 + "}]}]")
    with pytest.raises(ValueError, match=r"huge\.json: invalid JSON value: Exceeds the limit"):
        build_workload(f"sharegpt:files={huge},min_rounds=1")


def test_a_jsonl_no_reader_knows_is_refused_naming_its_fields(tmp_path, capsys):
    """Old: read as a token trace, "field 'session_id': missing"."""
    path = tmp_path / "ultrachat.jsonl"
    path.write_text(json.dumps({"id": "0", "data": ["hi", "hello"]}) + "\n")
    code, text = _stats(path, capsys)
    assert code == 2 and "neither a token trace" in text and "(its first record's fields: data, id)" in text
    token = tmp_path / "broken_token_trace.jsonl"          # a token trace's own errors stay its reader's
    token.write_text(json.dumps({"session_id": 0, "turn_id": 0}) + "\n")
    code, text = _stats(token, capsys)
    assert code == 2 and "neither a token trace" not in text


def test_an_input_without_records_calls_or_turns_says_so(tmp_path):
    """Old: advice to lower min_rounds to the 1 already set, or "its data and parameters leave none"."""
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(ConfigError, match=r"the input holds no records$"):
        build_workload(f"sharegpt:files={empty},min_rounds=1")
    with pytest.raises(ConfigError, match=r"the input holds no records \(a folder is searched for \.json"):
        build_workload(f"swe:files={empty}")
    silent = tmp_path / "silent.jsonl"
    silent.write_text(json.dumps({"instance_id": "q", "messages": [{"role": "user", "content": "anyone?"},
                                                                   {"role": "user", "content": "hello?"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"none of the 1 trajectories kept has an assistant message after its"):
        build_workload(f"swe:files={silent}")
    with pytest.raises(ConfigError, match=r"none of the 1 conversations kept has a user message answered"):
        build_workload(f"sharegpt:files={silent},min_rounds=1")


def test_run_folders_and_parquet_given_to_the_agent_recipe(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for k in range(2):
        (run / f"repo__repo-{k}.TRAJ").write_text(json.dumps({"history": _agent(k, content="look")}))
    (run / "results.json").write_text(json.dumps({"resolved": ["repo__repo-0"]}))     # SWE-agent's evaluation
    assert raw_source_of(run) == "swe"
    assert load_trace(str(run)).meta["num_sessions"] == 2
    table = tmp_path / "trajs.parquet"
    table.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"trajs\.parquet: the SWE recipe reads \.json, \.traj and \.jsonl"):
        build_workload(f"swe:files={table}")


def test_a_conversation_stored_as_a_json_string_is_read_as_its_list(tmp_path):
    as_text = tmp_path / "as_text.jsonl"
    as_text.write_text(json.dumps({"conversations": json.dumps(_chat(0))}) + "\n")
    as_list = tmp_path / "as_list.jsonl"
    as_list.write_text(json.dumps({"conversations": _chat(0)}) + "\n")
    assert raw_source_of(as_text) == "sharegpt"
    spec = "sharegpt:files={},min_rounds=1"
    assert _tokens(build_workload(spec.format(as_text))) == _tokens(build_workload(spec.format(as_list)))
    not_a_list = tmp_path / "not_a_list.jsonl"
    not_a_list.write_text(json.dumps({"conversations": "hello"}) + "\n")
    with pytest.raises(ValueError, match=r"not_a_list\.jsonl:1: the conversation must be a list, got a string"):
        list(read_chat_records([not_a_list]))


def test_a_shortfall_note_counts_the_sessions_that_yield_no_request(tmp_path):
    """Old: "2 sessions, not the 100 asked" beside a trace of 1 session, with nothing saying why."""
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"},
                                             {"role": "assistant", "content": "b"}]}) + "\n"
                    + json.dumps({"messages": _chat(1)}) + "\n")
    notes: list[str] = []
    trace = load_trace(f"sharegpt:files={path},min_rounds=1", notice=notes.append)
    assert len({r.session_id for r in trace}) == 1
    assert any("2 sessions, not the 100 asked: the input holds 2 records; 1 of the 2 yield no request" in n
               for n in notes), notes


def test_openai_agent_records_opening_with_one_that_used_no_tool_are_still_trajectories(tmp_path):
    """Old: the first record alone decided, so an agent's file whose first run answered without a tool
    was read as chats, and the paper's chat filter then refused it for having no long conversations."""
    direct = {"messages": _chat(0, turns=1)}        # an agent that answered directly: chat-shaped
    mixed = tmp_path / "agent_runs.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in [direct] + [{"messages": _agent(k)} for k in range(3)]))
    assert raw_source_of(mixed) == "swe"
    trace = load_trace(str(mixed))
    assert trace.meta["num_sessions"] == 4
    as_array = tmp_path / "agent_runs.json"               # the same records as one JSON array
    as_array.write_text(json.dumps([direct] + [{"messages": _agent(k)} for k in range(3)], indent=1))
    assert raw_source_of(as_array) == "swe"
    assert _tokens(load_trace(str(as_array))) == _tokens(trace)
    # chats alone stay chats, however many records are looked at; a tool past the look does not count
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": _chat(k)}) + "\n" for k in range(70)))
    assert raw_source_of(chats) == "sharegpt"
    late = tmp_path / "late.jsonl"
    late.write_text(chats.read_text() + json.dumps({"messages": _agent(0)}) + "\n")
    assert raw_source_of(late) == "sharegpt"
    chat_array = tmp_path / "chats.json"
    chat_array.write_text(json.dumps([{"messages": _chat(k)} for k in range(70)] + [{"messages": _agent(0)}]))
    assert raw_source_of(chat_array) == "sharegpt"


def test_a_shortfall_note_is_one_note_wherever_it_is_printed(tmp_path, capsys):
    """The shortfall notice came with its own ``NOTE:``, so the benches and the replay, which print
    notices as ``NOTE:`` lines, wrote ``NOTE: NOTE: trace ...``, and ``simulate`` wrote its stand-in
    notice without one. Every printer now adds the one ``NOTE:``."""
    from marconi.commandline import load_trace as cli_load_trace
    from marconi.integrations.common.bench import select_requests

    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps({"messages": _chat(k)}) + "\n" for k in range(2)))
    name = f"sharegpt:files={path},min_rounds=1"
    for load in (lambda: select_requests(name, max_input_len=8192), lambda: cli_load_trace(name)):
        load()
        err = capsys.readouterr().err
        assert err.startswith(f"NOTE: trace {name}: 2 sessions, not the 100 asked") and "NOTE: NOTE:" not in err, err
