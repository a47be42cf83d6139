"""A three-step workflow. Run it twice: the second run replays the journal.

    python examples/hello.py

Uses DURABLE_DATABASE_URL if set, else starts the embedded PostgreSQL server.
"""

from __future__ import annotations

import sys

import durable


# Explicit names keep the journal valid whether this file runs as a script (__main__) or
# is imported by `durable worker --app examples.hello`.
@durable.step(name="hello.greet")
def greet(name: str) -> str:
    print(f"  step 1: greeting {name}")
    return f"Hello, {name}"


@durable.step(name="hello.shout", retries=3)
def shout(text: str) -> str:
    print("  step 2: shouting")
    return text.upper() + "!"


@durable.step(name="hello.sign")
def sign(text: str) -> str:
    print("  step 3: signing")
    return f"{text} -- durable"


@durable.workflow(name="hello")
def hello(name: str) -> str:
    return sign(shout(greet(name)))


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "world"
    with durable.Engine() as engine:
        workflow_id = f"hello-{name}"
        print(f"workflow {workflow_id}:")
        handle = engine.start(hello, name, workflow_id=workflow_id)
        print(f"result: {handle.result(timeout=30)}")
        steps = engine.steps(workflow_id)
        print(f"journal: {len(steps)} steps recorded; run again and no step prints: it replays")


if __name__ == "__main__":
    main()
