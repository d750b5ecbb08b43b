"""The programs SGLang's paper and examples are built from, written the way those programs write
them (only the import differs: `import radixlm as rl` for `import sglang as sgl`), on a real
`radixlm serve` with the bundled model: the multi-dimension judge (`forks[i] += ...`, and the
chat-role version that reads `f["judgment"]` without a join), parallel sampling
(`forks += ...`), tree-of-thought (forks of forks returned from helpers, roles inside forks),
a ReAct loop and MMLU-style few-shot through `run_batch`.

The model is tiny, so the tests check what the programs must do whatever it writes: every
variable set, branches kept apart, the parent's text intact, shared prefixes reused."""

from __future__ import annotations

import re

import pytest

import radixlm as rl

from helpers import start_server, stop_server


@pytest.fixture(scope="module")
def backend():
    proc, url = start_server("--max-total-tokens", "16384")
    be = rl.RuntimeEndpoint(url)
    yield be
    be.shutdown()
    stop_server(proc)


# ---------------------------------------------------------------------- multi-dimension judge

SYSTEM_PROMPT = "You are a strict reviewer. Judge the article below without leniency."

DIMENSIONS = [
    "Clarity: whether each sentence is easy to follow.",
    "Accuracy: whether the facts in the article are correct.",
    "Style: whether the article reads well.",
]

ARTICLES = [
    "The sky looks blue because air scatters blue sunlight more than red sunlight.",
    "Water boils at 100 degrees Celsius at sea level, and lower on high mountains.",
]


@rl.function
def multi_dimension_judge(s, article):
    s += SYSTEM_PROMPT
    s += "\n```\n" + article + "\n```\n\n"

    forks = s.fork(len(DIMENSIONS))
    for i in range(len(DIMENSIONS)):
        forks[i] += ("USER: Judge the article on this metric only. " + DIMENSIONS[i]
                     + " Write one short paragraph about this metric and nothing else. "
                     'End the paragraph with the word "END"\nJUDGE:')
        forks[i] += rl.gen("judgement", max_tokens=8, stop="END")
    forks.join()

    s += "I judged the article on these metrics.\n"
    for i in range(len(DIMENSIONS)):
        s += DIMENSIONS[i].split(":")[0] + ": " + forks[i]["judgement"].strip() + "\n"

    s += "In summary, on a scale of 1 to 10, the article gets a score of"
    s += rl.gen("score", max_tokens=2)


def test_multi_dimension_judge(backend, tokenizer, capfd):
    states = multi_dimension_judge.run_batch(
        [{"article": a} for a in ARTICLES], temperature=0, backend=backend, num_threads=2,
        progress_bar=True)
    assert "2/2" in capfd.readouterr().err
    for state, article in zip(states, ARTICLES):
        assert state.error() is None
        judgements = state["judgement"]
        assert len(judgements) == len(DIMENSIONS) and all(j.strip() for j in judgements)
        head = SYSTEM_PROMPT + "\n```\n" + article + "\n```\n\n"
        summary = "".join(d.split(":")[0] + ": " + j.strip() + "\n"
                          for d, j in zip(DIMENSIONS, judgements))
        # The parent holds exactly its own text: the branches' prompts stayed in the branches.
        assert state.text() == (head + "I judged the article on these metrics.\n" + summary
                                + "In summary, on a scale of 1 to 10, the article gets a score "
                                  "of" + state["score"])
        assert state["score"]
        # Every branch found the shared article in the radix cache (committed once at fork).
        shared = len(tokenizer(head).input_ids)
        for meta in state.get_meta_info("judgement"):
            assert meta["cached_tokens"] >= shared - 2, meta


@rl.function
def multi_dimensional_judge_chat(s, essay):
    s += rl.system("Evaluate an essay.")
    s += rl.user_begin() + "Essay: " + essay + rl.user_end()
    s += rl.assistant("Sure!")

    forks = s.fork(2)
    for f, dim in zip(forks, ["clarity", "accuracy"]):
        f += rl.user("Evaluate the essay only for " + dim + ". End your judgment with 'END'.")
        f += rl.assistant("Judgment:" + rl.gen("judgment", max_tokens=8, stop="END"))

    s += rl.user("Summarize these judgments:\n"
                 + "".join(dim + ": " + f["judgment"] + "\n"
                           for f, dim in zip(forks, ["clarity", "accuracy"])))
    s += rl.assistant(rl.gen("output", max_tokens=4))


def test_judge_with_roles_reads_forks_without_join(backend):
    state = multi_dimensional_judge_chat.run(essay=ARTICLES[0], temperature=0, backend=backend)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == "Essay: " + ARTICLES[0]
    assert messages[2]["content"] == "Sure!" and messages[4]["content"] == state["output"]
    # The summary quotes each branch's generation; the branches' own messages stay theirs.
    assert "Evaluate the essay only" not in state.text()
    assert "clarity:" in messages[3]["content"] and "accuracy:" in messages[3]["content"]
    assert "judgment" not in state.variables()         # no join: nothing gathered


# ---------------------------------------------------------------------- parallel sampling

@rl.function
def parallel_sample(s, question, n):
    s += ("Question: What is 2 + 3?\nReasoning: I add the numbers.\nTool: calculator\n"
          "Answer: 5\n")
    s += "Question: " + question + "\n"
    forks = s.fork(n)
    forks += "Reasoning:" + rl.gen("reasoning", max_tokens=8, stop="\n") + "\n"
    forks += "Tool:" + rl.gen("tool", choices=[" calculator", " browser"]) + "\n"
    forks += "Answer:" + rl.gen("answer", max_tokens=3, stop="\n") + "\n"
    forks.join()


def test_parallel_sample(backend):
    state = parallel_sample.run(question="What is 4 + 4?", n=3, temperature=0.8,
                                backend=backend)
    text = state.text()
    assert text.endswith("Question: What is 4 + 4?\n")            # forks did not write here
    for name in ("reasoning", "tool", "answer"):
        assert len(state[name]) == 3
    assert all(t in (" calculator", " browser") for t in state["tool"])
    assert all(r.strip() for r in state["reasoning"])


# ---------------------------------------------------------------------- tree of thought

def propose_plan(s, question, num_branches):
    s += rl.user("Give a short plan for solving this question, without computing anything. "
                 "Question: " + question)
    forks = s.fork(num_branches)
    forks += rl.assistant(rl.gen("plan", max_tokens=6, temperature=0.3))
    return forks


def execute_plan(s, num_branches):
    s += rl.user("Good plan. Now follow it step by step and give the final answer.")
    forks = s.fork(num_branches)
    forks += rl.assistant(rl.gen("answer", max_tokens=6, temperature=0.3))
    return forks


def reflect_solution(s, num_branches):
    s += rl.user("Check your solution and score it from 1 to 5.")
    forks = s.fork(num_branches)
    forks += rl.assistant(rl.gen("score", max_tokens=3, temperature=0.3))
    return forks


def get_final_answer(s, num_branches):
    s += rl.user("Based on your reflection, state the final answer as a number.")
    forks = s.fork(num_branches)
    forks += rl.assistant(rl.gen("final_answer", max_tokens=3, temperature=0.3))
    return forks


@rl.function
def tree_search(s, question, num_branches):
    forks_to_join = []

    plan_forks = propose_plan(s, question, num_branches)
    forks_to_join.append(plan_forks)

    sol_states = []
    for plan in plan_forks:
        forks = execute_plan(plan, num_branches)
        forks_to_join.append(forks)
        sol_states.extend(forks)

    ref_states = []
    for sol in sol_states:
        forks = reflect_solution(sol, num_branches)
        forks_to_join.append(forks)
        ref_states.extend(forks)

    for ref in ref_states:
        forks = get_final_answer(ref, 1)
        forks_to_join.append(forks)

    for f in reversed(forks_to_join):
        f.join()


@pytest.mark.slow
def test_tree_of_thought(backend):
    question = "Tom has 3 apples and buys 4 more. How many apples does he have?"
    state = tree_search.run(question=question, num_branches=2, temperature=0, backend=backend)
    # Joins gather level by level: two plans, each with two answers, each with two scores,
    # each with one final answer.
    assert len(state["plan"]) == 2 and all(p.strip() for p in state["plan"])
    answers = [x for xs in state["answer"] for x in xs]
    scores = [x for xss in state["score"] for xs in xss for x in xs]
    finals = [x for xsss in state["final_answer"] for xss in xsss for xs in xss for x in xs]
    assert (len(answers), len(scores), len(finals)) == (4, 8, 8)
    assert all(isinstance(x, str) and x.strip() for x in answers + scores + finals)
    # The root holds only the question; every assistant turn was written in a branch.
    assert [m["role"] for m in state.messages()] == ["user"]
    assert question in state.text()


# ---------------------------------------------------------------------- ReAct

REACT_PROMPT = """Answer questions by searching. Use Search[term] to look something up and \
Finish[answer] to answer.
Question: What is the capital of Spain?
Thought 1: I need to find the capital of Spain, so I search for Spain.
Action 1: Search[Spain]
Observation 1: Spain is a country in Europe. Its capital is Madrid.
Thought 2: The capital of Spain is Madrid.
Action 2: Finish[Madrid]
Question: What is the capital of Kenya?
Thought 1: I need to find the capital of Kenya, so I search for Kenya.
Action 1: Search[Kenya]
Observation 1: Kenya is a country in Africa. Its capital is Nairobi.
Thought 2: The capital of Kenya is Nairobi.
Action 2: Finish[Nairobi]
"""

# A made-up country: the model can only learn its capital from the tool.
ENCYCLOPEDIA = {
    "zorbia": "Zorbia is a small island nation. Its capital is Qelt.",
    "france": "France is a country in Europe. Its capital is Paris.",
}


def search_tool(term: str) -> str:
    for key, entry in ENCYCLOPEDIA.items():
        if key in term.lower():
            return entry
    return "No entry found."


@rl.function
def react_agent(s, question, max_steps, tool_calls):
    s += REACT_PROMPT + "Question: " + question + "\n"
    for i in range(1, max_steps + 1):
        s += f"Thought {i}:"
        ss = s.fork(1)
        ss[0] += rl.gen("thought", max_tokens=20, stop=["\n", "Action"])
        ss.join()
        s += ss[0]["thought"] + "\n"
        s += f"Action {i}: " + rl.select("action", choices=["Search", "Finish"])
        s += "[" + rl.gen("argument", max_tokens=6, stop=["]", "\n"]) + "]\n"
        if s["action"] == "Finish":
            break
        observation = search_tool(s["argument"])
        tool_calls.append((s["argument"], observation))
        s += f"Observation {i}: " + observation + "\n"


def test_react_loop(backend):
    tool_calls: list[tuple[str, str]] = []
    state = react_agent.run(question="What is the capital of Zorbia?", max_steps=2,
                            tool_calls=tool_calls, temperature=0, backend=backend)
    text = state.text()
    steps = re.findall(r"^Action (\d+): (Search|Finish)\[", text[len(REACT_PROMPT):], re.M)
    assert steps, text
    # The loop stopped at Finish or after max_steps; each Search's observation is what the tool
    # returned for the generated term, placed right after that action.
    assert steps[-1][1] == "Finish" or len(steps) == 2
    assert len(tool_calls) == sum(kind == "Search" for _, kind in steps)
    for term, observation in tool_calls:
        assert f"Search[{term}]\nObservation " in text and observation in text
    assert state["action"] == steps[-1][1]
    assert [int(n) for n, _ in steps] == list(range(1, len(steps) + 1))
    # The agent searched, and answered with what only the tool knew.
    assert tool_calls and steps[-1][1] == "Finish" and "Qelt" in state["argument"], text


# ---------------------------------------------------------------------- MMLU-style few-shot

MMLU_EXAMPLES = """The following are multiple choice questions (with answers) about general \
knowledge.

How many legs does a spider have?
A. 4
B. 6
C. 8
D. 10
Answer: C

Which planet is closest to the Sun?
A. Mercury
B. Venus
C. Earth
D. Mars
Answer: A

"""

MMLU_QUESTIONS = [
    ("What colour is grass?\nA. Blue\nB. Green\nC. Red\nD. Black\nAnswer:", "B"),
    ("How many days are in a week?\nA. 7\nB. 5\nC. 10\nD. 3\nAnswer:", "A"),
    ("What do bees make?\nA. Milk\nB. Silk\nC. Honey\nD. Wool\nAnswer:", "C"),
]


@rl.function
def few_shot_mmlu(s, examples, question):
    s += examples + question + rl.gen("answer")


def test_mmlu_few_shot(backend, tokenizer, capfd):
    arguments = [{"examples": MMLU_EXAMPLES, "question": q} for q, _ in MMLU_QUESTIONS]
    states = few_shot_mmlu.run_batch(arguments, temperature=0, max_new_tokens=1,
                                     backend=backend, num_threads=3, progress_bar=True)
    assert "3/3" in capfd.readouterr().err
    preds = [s["answer"].strip()[0] if len(s["answer"].strip()) > 0 else "" for s in states]
    assert all(p in "ABCD" and p for p in preds), preds
    assert all(s.get_meta_info("answer")["completion_tokens"] == 1 for s in states)
    # run_batch cached the shared few-shot examples once; every program reused them.
    shared = len(tokenizer(MMLU_EXAMPLES).input_ids)
    assert all(s.get_meta_info("answer")["cached_tokens"] >= shared - 2 for s in states)
