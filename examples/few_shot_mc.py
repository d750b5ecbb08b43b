"""Few-shot multiple choice: 5-shot prompts that share their examples, answered by select over
the four options (letter and text, each scored by its mean token logprob), run as a batch (the
shared examples are cached once before the batch starts).

    python examples/few_shot_mc.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import time

import _backend

import radixlm as rl

SHOTS = [
    ("What color is the sky on a clear day?", ["Green", "Blue", "Red", "Black"], "B"),
    ("How many legs does a spider have?", ["Six", "Four", "Eight", "Ten"], "C"),
    ("Which planet do we live on?", ["Earth", "Mars", "Venus", "Jupiter"], "A"),
    ("What is 2 + 3?", ["4", "6", "7", "5"], "D"),
    ("Which animal says 'moo'?", ["Dog", "Cow", "Cat", "Duck"], "B"),
]

QUESTIONS = [
    ("What is the capital of France?", ["Berlin", "Madrid", "Paris", "Rome"], "C"),
    ("What do bees make?", ["Honey", "Milk", "Silk", "Wool"], "A"),
    ("How many days are in a week?", ["Five", "Six", "Ten", "Seven"], "D"),
    ("What is frozen water called?", ["Steam", "Ice", "Sand", "Glass"], "B"),
    ("Which is the largest ocean?", ["Pacific", "Atlantic", "Indian", "Arctic"], "A"),
    ("What gas do plants take in?", ["Oxygen", "Helium", "Carbon dioxide", "Neon"], "C"),
]


def format_question(question: str, options: list[str]) -> str:
    lines = [f"Question: {question}"]
    lines += [f"{letter}. {option}" for letter, option in zip("ABCD", options)]
    return "\n".join(lines) + "\nAnswer:"


@rl.function
def multiple_choice(s, question: str, options: list[str]):
    s += "The following are multiple choice questions, with answers.\n\n"
    for q, opts, answer in SHOTS:
        s += format_question(q, opts) + f" {answer}. {opts['ABCD'.index(answer)]}\n\n"
    s += format_question(question, options)
    s += rl.select("answer", choices=[f" {letter}. {o}" for letter, o in zip("ABCD", options)])


def main() -> None:
    args = _backend.parser(__doc__.splitlines()[0]).parse_args()
    with _backend.backend_from(args) as backend:
        start = time.perf_counter()
        states = multiple_choice.run_batch(
            [{"question": q, "options": o} for q, o, _ in QUESTIONS], progress_bar=True)
        elapsed = time.perf_counter() - start
        correct = 0
        for (question, _, answer), state in zip(QUESTIONS, states):
            got = state["answer"].strip()[0]   # " C. Paris" -> "C"
            correct += got == answer
            print(f"{'ok ' if got == answer else 'bad'} {question} -> {got} (expected {answer})")
        usage = backend.usage.snapshot()
        print(f"accuracy {correct}/{len(QUESTIONS)}, {len(QUESTIONS) / elapsed:.2f} programs/s, "
              f"cache hit rate {usage['cache_hit_rate']:.2f}")


if __name__ == "__main__":
    main()
