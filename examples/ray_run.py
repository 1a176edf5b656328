"""Training on Ray: rollouts run in Ray workers, the search stays in this process.

`RayExecutor` ships the agent to Ray workers (cloudpickle), runs each rollout there and
sends back its output, score and trace; the optimizer, the aggregator and the decisions
stay here. A worker or node that dies mid-rollout is retried on another, a hung rollout
is stopped at `timeout`, and model rate limits are shared across all workers. Here Ray
starts locally (`ray.init` is called for you when no cluster is running; pass
`address="auto"` to join one). Each rollout does half a second of CPU-bound work
outside the model, which is why it pays to spread them.

    python examples/ray_run.py        # offline, about 20 s (most of it Ray starting)
"""

from __future__ import annotations

import json
import time

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, ScriptedModel
from opto.executors import RayExecutor


def answer(messages: list[dict]) -> str:
    """A stand-in for a real model: it doubles the number when told to."""
    return str(2 * int(messages[1]["content"])) if "Double" in messages[0]["content"] else "?"


class Doubler(Agent):
    def __init__(self) -> None:
        self.model = ScriptedModel(answer, name="agent-model")
        self.prompt = Parameter("Answer.", description="the system prompt")

    async def forward(self, x: int) -> str:
        started = time.process_time()
        while time.process_time() - started < 0.5:  # the agent's own work: parsing, tools, ...
            pass
        messages = [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": str(x)}]
        return (await self.model.complete(messages)).text


def main() -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    brain = ScriptedModel(lambda messages: json.dumps({"suggestion": {"prompt": "Double the number."}}))
    data = [{"x": i, "info": str(2 * i)} for i in range(8)]
    executor = RayExecutor(num_cpus=1)
    trainer = AggregatedUpdate(Doubler(), Optimizer(brain), llm=brain, executor=executor, validation=data)
    started = time.monotonic()
    result = trainer.train(ExactMatchGuide(), data, batch_size=8, test_dataset=data, progress=False)
    seconds = time.monotonic() - started
    executor.close()
    ray.shutdown()
    rollouts = result.usage_by_model["agent-model"].calls  # one model call per rollout
    print(f"accuracy before {result.initial_test_score:.2f} after {result.final_test_score:.2f}")
    print(f"{rollouts} rollouts of 0.5 s CPU each in {seconds:.1f} s on 2 Ray workers")


if __name__ == "__main__":
    main()
