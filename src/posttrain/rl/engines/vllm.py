"""vLLM generation backend (GPU). A stub written against vLLM's public API; NOT TESTED here (no GPU, no vllm
on the development machine).

- Sampling: ``SamplingParams(n=1, temperature, top_p, max_tokens, logprobs=0, stop_token_ids)``; with
  ``logprobs=0`` vLLM returns the log-prob of each sampled token. vLLM's default reports log-probs of the *raw*
  model distribution; we ask for ``logprobs_mode="processed_logprobs"`` (vLLM >= 0.10.2) so they are under the
  temperature/top-p distribution the token was drawn from, as the HF backend does.
- Weights: the learner's packed buckets are unflattened on the actor and passed as ``(name, tensor)`` pairs to
  the model's ``load_weights`` via ``LLM.collective_rpc`` (the documented RLHF weight-update path), with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine runs in the actor's process. LoRA
  adapters would instead be saved and loaded as a ``LoRARequest``; not implemented in this stub.
"""

from __future__ import annotations

from posttrain.rl.engines.base import Generation, GenerationEngine


class VLLMEngine(GenerationEngine):
    def __init__(self, model_path: str, tokenizer, stop_ids: list[int], sync_param_names: list[str],
                 gpu_memory_utilization: float = 0.5):
        import os

        # keep vLLM's engine in this process, so weight tensors received here can be loaded without a copy
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.llm = LLM(model=model_path, gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs")
        self.tokenizer, self.stop_ids, self.names = tokenizer, list(stop_ids), list(sync_param_names)
        self._staging: list = []

    def generate(self, prompt_ids, max_new_tokens, temperature, top_p) -> Generation:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0,
                                stop_token_ids=self.stop_ids)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], params, use_tqdm=False)
        ids, lps = [], []
        for o in outs:
            c = o.outputs[0]
            ids.append(list(c.token_ids))
            lps.append([float(step[tok].logprob) for step, tok in zip(c.logprobs, c.token_ids)])
        return Generation(ids, lps)

    def sync_targets(self) -> list:
        """CPU/GPU staging tensors the weight receiver fills; pushed into vLLM by ``weights_loaded``."""
        import torch

        if not self._staging:
            from transformers import AutoModelForCausalLM  # shapes only, on the meta device

            with torch.device("meta"):
                ref = AutoModelForCausalLM.from_config(self.llm.llm_engine.model_config.hf_config)
            shapes = dict((n, p) for n, p in ref.named_parameters())
            self._staging = [torch.empty(shapes[n].shape, dtype=shapes[n].dtype, device="cuda") for n in self.names]
        return self._staging

    def weights_loaded(self) -> None:
        named = list(zip(self.names, self._staging))

        def _load(worker, weights=named):  # runs inside each vLLM worker
            worker.model_runner.model.load_weights(weights=weights)

        self.llm.collective_rpc(_load)
        self.llm.reset_prefix_cache()
