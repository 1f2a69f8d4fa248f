"""A math solver and a verifier written as plain OpenAI client code: drmas trains them through its gateway.

Nothing here knows drmas beyond two endpoints: POST $DRMAS_EPISODES_URL hands out an episode (a problem and its
id), POST $DRMAS_EPISODES_URL/<id>/reward ends it (here with the final answer, which drmas grades, and the calls
whose reply had the wrong format, which draw drmas' format penalty). Every chat call names its agent as the
`model` and its episode in `user`; drmas starts this program with OPENAI_BASE_URL and OPENAI_API_KEY pointing at
the gateway. The prompts are those of drmas' built-in math system."""

import json
import os
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from drmas
EPISODES, ROUNDS = os.environ["DRMAS_EPISODES_URL"], int(os.environ.get("ROUNDS", "2"))
ADD = "Sam has 3 pens and gets 4 more. How many pens does Sam have now?"
SUB = "Lily has 9 cups and breaks 2. How many cups does Lily have left?"
SOLVER = ("You are a math solver. Write one short line of working, then the final number in \\boxed{}.",
          [(ADD, "3 + 4 = 7. The answer is \\boxed{7}."), (SUB, "9 - 2 = 7. The answer is \\boxed{7}.")])
VERIFIER = ("You check answers to math questions. Redo the calculation in one line, then write "
            "<verify>approve</verify> if the answer is right or <verify>reject</verify> if it is wrong.",
            [(f"Question: {SUB}\nProposed answer: 7", "9 - 2 = 7, so 7 is right. <verify>approve</verify>"),
             (f"Question: {ADD}\nProposed answer: 8", "3 + 4 = 7, so 8 is wrong. <verify>reject</verify>")])
VERDICT = re.compile(r"<\s*verify\s*>\s*(approve|reject)\s*<\s*/\s*verify\s*>", re.IGNORECASE)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {
        "Content-Type": "application/json", "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def chat(agent: str, episode: str, role: tuple, request: str):
    system, demos = role
    messages = [{"role": "system", "content": system}]
    for question, answer in demos:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": request})
    reply = client.chat.completions.create(model=agent, messages=messages, user=episode)
    return reply.id, reply.choices[0].message.content


def boxed(solution: str) -> str:
    """The solver's last \\boxed{} answer ("" when there is none: a reply in the wrong format)."""
    start = solution.rfind("\\boxed{")
    end = solution.find("}", start)
    return solution[start + 7:end].strip() if start >= 0 and end >= 0 else ""


def episode() -> None:
    """One episode: the solver answers; the verifier approves (done) or rejects (the solver tries again)."""
    claim = post(EPISODES, {})
    question, solution, verdict, invalid = claim["problem"]["question"], "", "", []  # invalid: calls in a wrong format
    for round_ in range(1, ROUNDS + 1):
        request = question if round_ == 1 else (
            f"{question}\n\nYour previous answer:\n{solution.strip()}\n\nA checker said:\n{verdict.strip()}\n\n"
            "Solve it again and put the final number in \\boxed{}.")
        call, solution = chat("solver", claim["id"], SOLVER, request)
        invalid += [call] if not boxed(solution) else []
        if round_ == ROUNDS:
            break
        answer = boxed(solution) or solution.strip()
        call, verdict = chat("verifier", claim["id"], VERIFIER, f"Question: {question}\nProposed answer: {answer}")
        verdicts = [v.lower() for v in VERDICT.findall(verdict)]
        invalid += [call] if not verdicts else []
        if verdicts[-1:] != ["reject"]:  # no verdict counts as approve
            break
    post(f"{EPISODES}/{claim['id']}/reward", {"answer": solution, "invalid_calls": invalid})


def worker() -> None:
    while True:
        try:
            episode()
        except urllib.error.HTTPError as exc:  # 503: no episode to run yet; anything else: go on with the next
            if exc.code != 503:
                print(f"episode failed: {exc}: {exc.read().decode(errors='replace')}", flush=True)


if __name__ == "__main__":
    workers = int(os.environ.get("DRMAS_EPISODES_IN_FLIGHT", "8"))
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(workers):
            pool.submit(worker)
