"""examples/openai_agents/agents.py with every chat call streamed (stream=True, the chunks joined back into the reply
it reads): the program bench/gateway.py --stream runs, so the gateway's streamed answers are measured on the same
episodes. Run with the example's directory as the working directory (the external system's `workdir`)."""

import os
import runpy
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

program = runpy.run_path("agents.py")  # its functions and client; its workers are started below
create = program["client"].chat.completions.create


def streamed(**request):
    chunks = list(create(stream=True, **request))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return SimpleNamespace(id=chunks[0].id, choices=[SimpleNamespace(message=SimpleNamespace(content=text))])


program["client"].chat.completions.create = streamed
workers = int(os.environ.get("DRMAS_EPISODES_IN_FLIGHT", "8"))
with ThreadPoolExecutor(workers) as pool:
    for _ in range(workers):
        pool.submit(program["worker"])
