"""Tree of thought: propose plans (forks), try each plan several times (forks of forks), ask the
model to verify every attempt (select yes/no), keep the best-scored answer.

    python examples/tree_of_thought.py [--url http://127.0.0.1:30000] [--width 2]
"""

from __future__ import annotations

import _backend

import radixlm as rl

QUESTION = "Tom has 3 boxes with 4 apples in each box. He eats 2 apples. How many are left?"


@rl.function
def tree_of_thought(s, question: str, width: int = 2):
    s += "Question: " + question + "\n"
    plans = s.fork(width)                                   # level 1: plans
    plans += "Plan: To solve this, I will" + rl.gen("plan", max_tokens=16, stop="\n",
                                                    temperature=0.8) + "\n"
    leaves = []
    for plan in plans:                                      # level 2: attempts per plan
        attempts = plan.fork(width)  # waits for this plan only; the others keep generating
        attempts += "Answer: The number of apples left is" + rl.gen("answer", max_tokens=8,
                                                                    stop="\n", temperature=0.8)
        attempts += "\nIs this answer correct? (yes or no):"
        attempts += rl.select("verdict", choices=[" yes", " no"])
        leaves += [(plan, attempt) for attempt in attempts]
    scored = []
    for plan, attempt in leaves:                            # now read: everything has run
        yes, no = attempt.get_meta_info("verdict")["scores"]
        scored.append((yes - no, plan["plan"].strip(), attempt["answer"].strip()))
    best = max(scored)
    s += f"Best plan: {best[1]}\nBest answer: {best[2]}\n"
    return scored


def main() -> None:
    p = _backend.parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2, help="branches at each level")
    args = p.parse_args()
    with _backend.backend_from(args):
        state = tree_of_thought.run(question=QUESTION, width=args.width)
        for score, plan, answer in sorted(state.ret_value, reverse=True):
            print(f"{score:+.3f}  plan: {plan!r}  answer: {answer!r}")
        print(state.text().split("Best plan:")[-1].strip().replace("\n", " | "))


if __name__ == "__main__":
    main()
