"""A ReAct-style loop: the model thinks, picks a tool (select), writes its input (gen), and the
program runs the tool and appends the observation, until the model picks "finish".

    python examples/react_agent.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import ast
import operator

import _backend

import radixlm as rl

FACTS = {"france": "The capital of France is Paris. France has 68 million people.",
         "japan": "The capital of Japan is Tokyo. Japan has 124 million people."}

EXAMPLE = """Question: How many people live in France and Japan together, in millions?
Thought 1: I need the population of France.
Action 1: lookup [france]
Observation 1: The capital of France is Paris. France has 68 million people.
Thought 2: I need the population of Japan.
Action 2: lookup [japan]
Observation 2: The capital of Japan is Tokyo. Japan has 124 million people.
Thought 3: I add the two numbers.
Action 3: calculator [68 + 124]
Observation 3: 192
Thought 4: I have the answer.
Action 4: finish [192 million]

"""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def calculator(expr: str) -> str:
    """+ - * / on numbers; nothing else is evaluated."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported expression")
    try:
        value = ev(ast.parse(expr.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(value) if float(value).is_integer() else value)


def lookup(topic: str) -> str:
    return FACTS.get(topic.strip().lower(), "No information found.")


TOOLS = {"lookup": lookup, "calculator": calculator}


@rl.function
def react(s, question: str, max_steps: int = 3):
    s += EXAMPLE + "Question: " + question + "\n"
    for step in range(1, max_steps + 1):
        s += f"Thought {step}:" + rl.gen("thought", max_tokens=16, stop="\n") + "\n"
        s += f"Action {step}:" + rl.select("action", choices=[" lookup", " calculator",
                                                               " finish"])
        s += " [" + rl.gen("input", max_tokens=12, stop=["]", "\n"]) + "]\n"
        action = s["action"].strip()
        if action == "finish":
            return s["input"].strip()
        observation = TOOLS[action](s["input"])
        print(f"step {step}: {action}[{s['input'].strip()}] -> {observation}")
        s += f"Observation {step}: {observation}\n"
    # Out of steps: make the model conclude with what it has.
    s += f"Action {max_steps + 1}: finish [" + rl.gen("input", max_tokens=12, stop=["]", "\n"])
    return s["input"].strip()


def main() -> None:
    args = _backend.parser(__doc__.splitlines()[0]).parse_args()
    with _backend.backend_from(args):
        state = react.run(question="What is the capital of Japan?", temperature=0)
        print("answer:", state.ret_value)


if __name__ == "__main__":
    main()
