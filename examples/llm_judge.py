"""Multi-dimension LLM judge: one essay, judged on six dimensions by six forks that share the
essay's prompt (committed to the cache once), then an overall score.

    python examples/llm_judge.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import _backend

import radixlm as rl

DIMENSIONS = ["Clarity", "Accuracy", "Originality", "Structure", "Engagement", "Concision"]

ESSAY = ("The sky looks blue because sunlight is scattered by the molecules of the air. "
         "Blue light has a shorter wavelength than red light, so it is scattered much more, "
         "and reaches our eyes from every direction of the sky.")


@rl.function
def multi_dimension_judge(s, essay: str):
    s += rl.system("You are a fair and strict judge of short essays.")
    s += rl.user_begin() + "Here is an essay:\n\n" + essay + "\n\n"
    forks = s.fork(len(DIMENSIONS))            # six judges sharing the essay, in parallel
    for f, dim in zip(forks, DIMENSIONS):
        f += f"Judge its {dim.lower()} in one short sentence." + rl.user_end()
        f += rl.assistant(rl.gen("judgement", max_tokens=16, stop="\n"))
    forks.join()                               # s["judgement"]: the six judgements, in order
    summary = "\n".join(f"{d}: {j.strip()}" for d, j in zip(DIMENSIONS, s["judgement"]))
    s += "Judgements of other readers:\n" + summary + "\nGive an overall score from 1 to 10."
    s += rl.user_end()
    s += rl.assistant("Overall score: " + rl.gen("score", dtype=int, regex=r"10|[1-9]"))


def main() -> None:
    args = _backend.parser(__doc__.splitlines()[0]).parse_args()
    with _backend.backend_from(args):
        state = multi_dimension_judge.run(essay=ESSAY, temperature=0)
        for dim, judgement in zip(DIMENSIONS, state["judgement"]):
            print(f"{dim:>11}: {judgement.strip()}")
        print(f"overall score: {state['score']}/10")


if __name__ == "__main__":
    main()
