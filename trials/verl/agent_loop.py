"""The runner's agent loop: each request asks for the response length the workload drew.

verl's default loop (``single_turn_agent``) lets the model stop at EOS, so with random
weights a response's length would be the model's whim. This one, registered with verl
through ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (a YAML list naming
``WorkloadAgentLoop`` under ``AGENT_NAME``, made by ``trials.verl.overrides``), sends the
prompt's own token ids (its words are its tokens: ``trials.verl.checkpoint``) and sets
``max_tokens`` to the length drawn for this sample (``extra_info.response_lengths``, one per
sample of the prompt: ``session_id`` in verl's v1 trainer, which runs the ``n`` samples
of a prompt as sessions 0..n-1) with ``ignore_eos``; both rollout servers (vLLM, SGLang)
take these from the request's sampling params. The rest is verl's single-turn loop.

Imported by verl's agent-loop workers (Ray actors), so only in verl's environment.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput
from verl.utils.profiler import simple_timer

from trials.verl.dataset import sample_length
from trials.verl.types import AGENT_NAME  # noqa: F401  (the name it is registered under)


class WorkloadAgentLoop(AgentLoopBase):
    """One generation per sample, of exactly the drawn length (``ignore_eos``)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra_info = dict(kwargs["extra_info"])
        messages = list(kwargs["raw_prompt"])
        prompt_ids = self.tokenizer.encode(messages[-1]["content"], add_special_tokens=False)
        want = int(extra_info["prompt_length"])
        if len(prompt_ids) != want:
            raise ValueError(
                f"prompt {extra_info['index']} is {len(prompt_ids)} tokens, its row says {want}: "
                "the dataset was written for another tokenizer; delete the runner's model cache"
            )
        max_tokens = min(
            sample_length(extra_info, kwargs.get("session_id")), self.rollout_config.response_length
        )
        params = {**sampling_params, "max_tokens": max_tokens, "ignore_eos": True}
        extra = {"priority": int(kwargs["priority"])} if "priority" in kwargs else {}
        metrics: dict[str, Any] = {}
        with simple_timer("generate_sequences", metrics):
            output = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=params, **extra
            )
        metrics["num_preempted"] = output.num_preempted if output.num_preempted is not None else -1
        response_ids = list(output.token_ids)[:max_tokens]
        logprobs = list(output.log_probs)[:max_tokens] if output.log_probs else None
        result = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=[1] * len(response_ids),
            response_logprobs=logprobs,
            num_turns=2,
            metrics=metrics,
            extra_fields=dict(output.extra_fields),
        )
        result.extra_fields.update({"turn_scores": [], "tool_rewards": []})
        return result
