"""The frontend language without a model: execution order, forks, streaming, errors, select's
decision rules and chat-role rendering, on a scripted backend (fast; no server)."""

from __future__ import annotations

import re
import time

import pytest

import radixlm as rl
from radixlm.lang.backends.base import GenResult
from radixlm.lang.chat import TemplateRenderer
from radixlm.lang.choices import greedy_token_selection, token_length_normalized

from lang_scripted import ScriptedBackend


def test_gens_run_in_order_and_see_the_whole_prompt():
    be = ScriptedBackend(reply=lambda ctx, args: f"[{len(ctx.text)}]")

    @rl.function
    def prog(s, name):
        s += "Hello " + name + "."
        s += rl.gen("a", max_tokens=3)
        s += " and " + rl.gen("b")

    state = prog.run(name="Ann", backend=be, max_new_tokens=7)
    assert state.text() == "Hello Ann.[10] and [19]"
    assert (state["a"], state["b"]) == ("[10]", "[19]")
    assert be.prompts == ["Hello Ann.", "Hello Ann.[10] and "]
    # gen settings override run()'s defaults, which fill the rest
    assert state.get_meta_info("a") == {"max_new_tokens": 3}
    assert state.get_meta_info("b") == {"max_new_tokens": 7}


def test_forks_share_the_prefix_and_run_in_parallel():
    be = ScriptedBackend(reply="x", delay=0.3)

    @rl.function
    def prog(s):
        s += "Shared prefix. "
        forks = s.fork(3)
        for i, f in enumerate(forks):   # appended one by one, yet the gens overlap in time
            f += f"Branch {i}: " + rl.gen("out")
        forks += "!"
        forks.join()
        s += "Done"

    state = prog.run(backend=be)
    assert be.cached == ["Shared prefix. "]          # committed once, before the branches
    starts, ends = zip(*be.intervals)
    assert max(starts) < min(ends), "the forks' gens did not overlap"
    assert state["out"] == ["x", "x", "x"]           # join gathers each fork's variable
    assert state.text() == "Shared prefix. Done"


def test_join_concatenate_and_nested_fork_levels():
    be = ScriptedBackend(reply="y")

    @rl.function
    def prog(s):
        s += "P:"
        forks = s.fork(2)
        for f in forks:
            sub = f.fork(2)
            sub += rl.gen("leaf")
            sub.join()
            f += str(len(f["leaf"]))
        forks.join("concate_and_append")

    assert prog.run(backend=be).text() == "P:22"


def test_stream_yields_pieces_then_ends():
    be = ScriptedBackend(reply="abc")

    @rl.function
    def prog(s):
        s += "Q:"
        s += rl.gen("a")
        s += "."

    state = prog.run(backend=be, stream=True)
    pieces = list(state.text_iter())
    assert pieces == ["Q:", "a", "b", "c", "."]
    assert list(state.text_iter("a")) == ["a", "b", "c"]


def test_unknown_variable_error_names_what_exists():
    @rl.function
    def prog(s):
        s += rl.gen("answer")

    state = prog.run(backend=ScriptedBackend())
    with pytest.raises(rl.VariableNotFoundError, match="'answr'.*'answer'"):
        state["answr"]
    with pytest.raises(KeyError):                    # still a KeyError for generic code
        state["answr"]


def test_select_on_a_backend_without_logprobs_is_a_clear_error():
    @rl.function
    def prog(s):
        s += "Pick:" + rl.select("c", choices=["a", "b"])

    with pytest.raises(rl.UnsupportedByBackendError, match="select"):
        prog.run(backend=ScriptedBackend())
    # The OpenAI backend inside a chat role: chat endpoints give no prompt logprobs.
    openai_be = rl.OpenAI("m", base_url="http://127.0.0.1:9/v1")

    @rl.function
    def chat(s):
        s += rl.user("Pick one")
        s += rl.assistant(rl.select("c", choices=["a", "b"]))

    with pytest.raises(rl.UnsupportedByBackendError, match="not supported"):
        chat.run(backend=openai_be)


def test_program_errors_surface_from_run_and_stop_the_state():
    def boom(ctx, args):
        raise rl.BackendUnavailableError("server gone")

    @rl.function
    def prog(s):
        s += rl.gen("a")
        s += rl.gen("b")

    be = ScriptedBackend(reply=boom)
    with pytest.raises(rl.BackendUnavailableError, match="server gone"):
        prog.run(backend=be)
    states = prog.run_batch([{}, {}], backend=be)    # a batch goes on; each state keeps it
    assert all(isinstance(s.error(), rl.BackendUnavailableError) for s in states)


def test_dtype_int_constrains_and_keeps_the_text():
    seen = []

    def reply(ctx, args):
        seen.append(args.regex)
        return "42"

    @rl.function
    def prog(s):
        s += "n=" + rl.gen("n", dtype=int) + rl.gen_int("m")

    state = prog.run(backend=ScriptedBackend(reply=reply))
    # The text, as SGLang stores it (its scripts call .strip() on it; int() converts).
    assert state["n"] == "42" and state["m"] == "42"
    assert seen == [r"-?[0-9]+", r"-?[0-9]+"]


def test_dtype_names_and_bool():
    replies = iter(["7", "2.5", "False", '"a \\"b\\""', '"c"'])
    seen = []

    def reply(ctx, args):
        seen.append(args.regex)
        return next(replies)

    @rl.function
    def prog(s):
        s += rl.gen("i", dtype="int") + rl.gen("f", dtype="float") + rl.gen("b", dtype=bool)
        s += rl.gen("s", dtype="str") + rl.gen_string("t")

    state = prog.run(backend=ScriptedBackend(reply=reply))
    assert (state["i"], state["f"], state["b"]) == ("7", "2.5", "False")
    assert (state["s"], state["t"]) == ('"a \\"b\\""', '"c"')    # (with the quotes)
    assert seen[:3] == [r"-?[0-9]+", r"-?[0-9]+(\.[0-9]+)?", "(True|False)"]
    assert seen[3] == seen[4] and seen[3] is not None
    string = re.compile(seen[3])
    assert string.fullmatch('"a \\"b\\""') and string.fullmatch('""')
    assert not any(string.fullmatch(t) for t in ('abc', '"a"b"', '"a', '"x\ny"'))
    with pytest.raises(ValueError, match="gen dtype"):
        rl.gen("x", dtype="list")


def test_run_batch_warms_the_prefix_all_programs_share():
    be = ScriptedBackend(reply="z")

    @rl.function
    def prog(s, q):
        s += "Examples: 1, 2, 3.\nQuestion: " + q + "\nAnswer:" + rl.gen("a")

    states = prog.run_batch([{"q": "alpha"}, {"q": "beta"}, {"q": "gamma"}], backend=be,
                            num_threads=2)
    assert [s["a"] for s in states] == ["z", "z", "z"]
    assert be.cached == ["Examples: 1, 2, 3.\nQuestion: "]


def test_choices_methods():
    lps = [[-0.5, -0.1], [-0.2, -3.0], [-0.2, -0.05, -0.05]]
    d = token_length_normalized(lps)
    assert d.index == 2 and d.scores[0] == pytest.approx(-0.3)
    # Greedy: choices 1 and 2 tie on the first token, 2 wins on the second.
    assert greedy_token_selection(lps).index == 2
    # A choice that is a prefix of a longer one competes with its mean after it ends.
    assert greedy_token_selection([[-1.0], [-1.0, -0.5]]).index == 1
    assert greedy_token_selection([[-1.0], [-1.0, -2.0]]).index == 0
    with pytest.raises(ValueError, match="choices_method"):
        rl.select("x", choices=["a"], choices_method="nope")


def test_roles_render_exactly_the_chat_template(tokenizer):
    be = ScriptedBackend(reply="Four.", renderer=TemplateRenderer(tokenizer))

    @rl.function
    def prog(s):
        s += rl.system("Be brief.")
        s += rl.user("What is 2+2?")
        s += rl.assistant(rl.gen("a"))
        s += rl.user_begin() + "Thanks" + rl.user_end()
        s += rl.assistant_begin() + rl.gen("b") + rl.assistant_end()

    state = prog.run(backend=be)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert state.text() == tokenizer.apply_chat_template(messages, tokenize=False)
    # Each gen's prompt is the template's generation prompt for the messages before it.
    assert be.prompts[0] == tokenizer.apply_chat_template(messages[:2], tokenize=False,
                                                          add_generation_prompt=True)
    assert be.prompts[1] == tokenizer.apply_chat_template(messages[:4], tokenize=False,
                                                          add_generation_prompt=True)


def test_user_first_gets_the_templates_default_system_prompt(tokenizer):
    be = ScriptedBackend(reply="Hi", renderer=TemplateRenderer(tokenizer))

    @rl.function
    def prog(s):
        s += rl.user("Hello") + rl.assistant(rl.gen("a"))

    state = prog.run(backend=be)
    assert state.text() == tokenizer.apply_chat_template(state.messages(), tokenize=False)


def test_assistant_first_renders_the_template(tokenizer):
    """A program that opens with the assistant's turn (a prefilled reply) gets the template's
    text for it, not the plain "Assistant: " format mixed with the template's end."""
    be = ScriptedBackend(reply="there", renderer=TemplateRenderer(tokenizer))

    @rl.function
    def prog(s):
        s += rl.assistant("Hello " + rl.gen("a"))
        s += rl.user("Hi")

    state = prog.run(backend=be)
    assert state.text() == tokenizer.apply_chat_template(state.messages(), tokenize=False)
    assert "Assistant: " not in state.text()


def test_nested_roles_are_an_error():
    @rl.function
    def prog(s):
        s += rl.user_begin() + rl.assistant("x")

    with pytest.raises(rl.LangError, match="roles do not nest"):
        prog.run(backend=ScriptedBackend())


def test_async_text_iter_and_missing_backend():
    import asyncio

    @rl.function
    def prog(s):
        s += "A" + rl.gen("x")

    state = prog.run(backend=ScriptedBackend(reply="bc"), stream=True)

    async def collect():
        return [piece async for piece in state.text_async_iter()]

    assert asyncio.run(collect()) == ["A", "b", "c"]
    if rl.get_default_backend() is None:
        with pytest.raises(ValueError, match="set_default_backend"):
            prog.run()


def test_fork_group_idioms_of_sglang_programs():
    be = ScriptedBackend(reply=lambda ctx, args: ctx.text.split()[-1])

    @rl.function
    def prog(s, dims):
        s += "Article. "
        forks = s.fork(len(dims))
        for i in range(len(dims)):
            forks[i] += "judge " + dims[i] + " "        # __iadd__ then __setitem__
            forks[i] += rl.gen("judgement")
        forks += lambda i: f" #{i}"                      # one item per fork, by index
        forks += [" a", " b"]                            # or as a list
        forks.join()
        for i in range(len(dims)):
            s += forks[i]["judgement"] + ";"
        with s.user():
            s += "hi"
        with s.var_scope("tail"):
            s += "xyz"

    state = prog.run(dims=["clarity", "style"], backend=be)
    assert state["judgement"] == ["clarity", "style"]
    assert state.text() == "Article. clarity;style;User: hi\nxyz"
    assert state["tail"] == "xyz"

    @rl.function
    def bad(s):
        forks = s.fork(2)
        forks[0] = "text"

    with pytest.raises(TypeError, match="cannot be replaced"):
        bad.run(backend=be)

    @rl.function
    def wrong_len(s):
        s.fork(2).__iadd__(["only one"])

    with pytest.raises(ValueError, match="one item per fork"):
        wrong_len.run(backend=be)

    @rl.function
    def wrong_mode(s):
        s.fork(2).join("merge")

    with pytest.raises(ValueError, match="join mode"):
        wrong_mode.run(backend=be)


class CompletionLike(ScriptedBackend):
    """A 'model' that knows one document: a prompt that is a prefix of it continues with the
    rest, any other prompt with " ?" and a newline. Stop strings and max tokens (one token a
    character) are honoured as a completions endpoint would."""

    def __init__(self, continuation: str):
        super().__init__()
        self.continuation = continuation
        self.calls = 0

    def api_speculation(self, ctx):
        return "completion"

    def generate(self, ctx, args):
        self.calls += 1
        full = self.continuation
        out = full[len(ctx.text):] if full.startswith(ctx.text) else " ?\n"
        reason = "stop"
        if len(out) > args.max_new_tokens:
            out, reason = out[:args.max_new_tokens], "length"
        stops = [args.stop] if isinstance(args.stop, str) else (args.stop or [])
        cuts = [out.find(st) for st in stops if st in out]
        if cuts:
            out, reason = out[:min(cuts)], "stop"
        return GenResult(out, {"finish_reason": {"type": reason}})


def test_api_speculation_merges_calls_and_falls_back():
    def run(spec, template_fields, model_text, max_tokens=30):
        be = CompletionLike(model_text)

        @rl.function(num_api_spec_tokens=spec)
        def character(s):
            s += "Character:\n"
            for field in template_fields:
                s += field + ":" + rl.gen(field.lower(), stop="\n", max_tokens=max_tokens) + "\n"

        state = character.run(backend=be)
        return be.calls, state.variables()

    model = "Name: Ada\nAge: 36\nJob: mathematician\n"
    assert run(None, ["Name", "Age", "Job"], "Character:\n" + model) == \
        (3, {"name": " Ada", "age": " 36", "job": " mathematician"})
    # One call covers all three fields when the model follows the template.
    calls, values = run(64, ["Name", "Age", "Job"], "Character:\n" + model)
    assert (calls, values) == (1, {"name": " Ada", "age": " 36", "job": " mathematician"})
    # The template differs from what the model wrote after Name: the kept text is dropped and
    # the later fields make normal calls, with the same values as without speculation.
    calls, values = run(64, ["Name", "Job"], "Character:\n" + model)
    assert (calls, values) == (2, {"name": " Ada", "job": " ?"})
    assert run(None, ["Name", "Job"], "Character:\n" + model)[1] == values
    # A speculative call cut before the stop, or a value that may exceed the gen's own
    # max_tokens: the gen falls back to a normal call, which returns what it always would.
    assert run(4, ["Name"], "Character:\n" + model, max_tokens=3) == (2, {"name": " Ad"})
    assert run(64, ["Name"], "Character:\n" + model, max_tokens=3) == (2, {"name": " Ad"})
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        rl.function(num_api_spec_tokens=0)(lambda s: None)

    # Kept text that answers a later gen but may exceed its max_tokens: one normal call for
    # it, not another speculative call that would fail the same size proof (probe 27: 3 calls
    # where speculation off makes 2).
    be = CompletionLike("Character:\n" + model)

    @rl.function(num_api_spec_tokens=64)
    def short_job(s):
        s += "Character:\nName:" + rl.gen("name", stop="\n", max_tokens=30) + "\n"
        s += "Age:" + rl.gen("age", stop="\n", max_tokens=30) + "\n"
        s += "Job:" + rl.gen("job", stop="\n", max_tokens=4) + "\n"

    state = short_job.run(backend=be)
    assert be.calls == 2 and state.variables() == {"name": " Ada", "age": " 36", "job": " mat"}


def test_api_speculation_on_a_chat_endpoint_writes_the_message_in_one_call():
    class ChatLike(ScriptedBackend):
        def api_speculation(self, ctx):
            return "chat"

    @rl.function(num_api_spec_tokens=32)
    def character(s):
        s += rl.user("Make up a character.")
        s += rl.assistant("Name:" + rl.gen("name", stop="\n") + "\nJob:"
                          + rl.gen("job", stop="\n"))

    seen = []

    def reply(ctx, args):
        seen.append((ctx.messages[-1]["role"], args.stop, args.max_new_tokens))
        return "Name: Ada\nJob: mathematician\n"

    state = character.run(backend=ChatLike(reply=reply), max_new_tokens=8)
    assert seen == [("user", None, 32)]                  # one call for the whole message
    assert (state["name"], state["job"]) == (" Ada", " mathematician")
    assert state.messages()[-1] == {"role": "assistant",
                                    "content": "Name: Ada\nJob: mathematician"}
    with pytest.raises(rl.LangError, match="does not follow"):
        character.run(backend=ChatLike(reply="I am Ada, a mathematician."))


def test_separate_reasoning_splits_the_thinking_off():
    """The gen's variable keeps the answer and <name>_reasoning_content the thinking; the
    program's text keeps both (SGLang's separate_reasoning)."""
    replies = iter(["Let me think.</think>Paris", "<think>hmm</think>\n\nRome", "No tags"])

    @rl.function
    def prog(s):
        s += "Q: " + rl.separate_reasoning(rl.gen("a"), model_type="deepseek-r1")
        s += " Q2: " + rl.separate_reasoning(rl.gen("b"), model_type="qwen3")
        s += " Q3: " + rl.separate_reasoning(rl.gen("c"), model_type="qwen3")

    state = prog.run(backend=ScriptedBackend(reply=lambda ctx, args: next(replies)))
    assert (state["a"], state["a_reasoning_content"]) == ("Paris", "Let me think.")
    assert (state["b"], state["b_reasoning_content"]) == ("Rome", "hmm")
    assert (state["c"], state["c_reasoning_content"]) == ("No tags", "")
    assert "Let me think.</think>Paris" in state.text()
    with pytest.raises(ValueError, match="model_type"):
        rl.separate_reasoning(rl.gen("x"), model_type="o1")
    with pytest.raises(ValueError, match="named gen"):
        rl.separate_reasoning(rl.gen(), model_type="qwen3")


def test_sglang_frontend_names_import():
    """What SGLang's frontend tutorial imports exists: set_default_backend from the api module,
    Runtime and Engine from the package; image() / video() refuse clearly when used."""
    from radixlm.lang.api import set_default_backend
    from radixlm.lang import Engine, Runtime, image, video
    import radixlm

    assert set_default_backend is rl.set_default_backend and Engine is radixlm.Engine
    assert Runtime is radixlm.Runtime
    for call in (lambda: image("cat.png"), lambda: video("clip.mp4", 8)):
        with pytest.raises(rl.UnsupportedByBackendError, match="vision-language"):
            call()


def test_reads_from_outside_a_streamed_program_wait_for_it():
    """run(stream=True) returns before the program has queued its gens: a read of a variable
    it defines later waits for it (probe 27: VariableNotFoundError at once), and text() waits
    for the program's end. A variable the program never defines is reported once it ends."""
    be = ScriptedBackend(reply="!")

    @rl.function
    def slow(s):
        s += "Hi"
        time.sleep(0.3)             # Python work before the gen is queued
        s += rl.gen("late", max_tokens=2)

    state = slow.run(stream=True, backend=be)
    assert state["late"] == "!"
    state = slow.run(stream=True, backend=be)
    assert state.text() == "Hi!"
    state = slow.run(stream=True, backend=be)
    with pytest.raises(rl.VariableNotFoundError):
        state["never"]


def test_select_without_prompt_text_is_refused():
    """A choice's first token with nothing before it has no logprob: every one-token choice
    would score -inf and the first would win, whatever the model thinks."""
    from radixlm.lang.backends.base import PromptContext
    from radixlm.lang.backends.native import NativeBackend

    class CharTokens(NativeBackend):     # one token per character; never asked to generate
        def _tokenize(self, texts):
            return [[ord(c) for c in t] for t in texts]

        def _generate(self, payload):
            raise AssertionError("select must be refused before any request")

        _generate_stream = _generate

    with pytest.raises(ValueError, match="select needs prompt text before it"):
        CharTokens().select(PromptContext(text="", messages=[]), ["A", "B"],
                            token_length_normalized, 0.0)
