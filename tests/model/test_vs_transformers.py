"""Rule M (FIDELITY.md) of the cpu-backend model against transformers' DeepseekV3ForCausalLM on the CPU.

Both sides compute and store in fp32 (the checkpoint's bf16 weights widen exactly on both sides), so the
tolerance is the fp32 one: per position ||ours - ref|| / ||ref|| <= 1e-4 for the logits and for every layer's
hidden state (output_hidden_states), teacher forced; argmax equal wherever the reference's top-1 minus top-2
exceeds eps = 1e-2 x std of that position's logits (the count below eps is printed); free-running greedy tokens
equal up to the first position below eps. Two generated checkpoints (tools/gen_checkpoint.py):
  (a) moe:   MoE + q LoRA + YaRN + grouped routing + real latent dims, 3 bf16 shards with an index;
  (b) dense: dense + plain q_proj + plain RoPE (rope_parameters spelling, not interleaved), tied, one f32 file.
Also: the same through 2 tensor-parallel shards (threads), the YaRN constants, and the command line's
handling of bad checkpoints (a message and exit status 1, never a crash).

Environment: DDTREE_MODEL_RUN = the ddtree-model-run binary (ctest sets it).
Run: ctest -L model, or DDTREE_MODEL_RUN=build/bin/ddtree-model-run python -m pytest -q tests/model
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import gen_checkpoint  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file  # noqa: E402

RUN = os.environ.get("DDTREE_MODEL_RUN", "")
TEACHER_TOKENS = 64
PROMPT = 8
GENERATE = 32
FP32_TOL = 1e-4


def run_tool(*args, check=True):
    if not RUN:
        pytest.skip("DDTREE_MODEL_RUN not set (run through ctest)")
    p = subprocess.run([RUN, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module", params=["moe", "dense"])
def case(request, tmp_path_factory):
    preset = request.param
    d = str(tmp_path_factory.mktemp(preset))
    gen_checkpoint.generate(d, preset, seed=0)
    ok, lines = gen_checkpoint.check(d, seed=0)
    print(f"\n[{preset}] fixture checks:\n  " + "\n  ".join(lines))
    assert ok, "generated checkpoint fails the FIDELITY.md fixture checks"
    cfg = json.load(open(os.path.join(d, "config.json")))
    tokens = gen_checkpoint.prompt_tokens(cfg["vocab_size"], TEACHER_TOKENS, seed=3)
    model = transformers.DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True)
        gen = model.generate(ids[:, :PROMPT], max_new_tokens=GENERATE, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    return dict(preset=preset, dir=d, cfg=cfg, tokens=tokens, model=model,
                logits=ref.logits[0].numpy(), hidden=[h[0].numpy() for h in ref.hidden_states],
                gen_tokens=gen.sequences[0, PROMPT:].numpy(), gen_scores=torch.stack(gen.scores)[:, 0].numpy())


def rel_err(a, b):
    """Per-position ||a - b|| / ||b|| over the last axis."""
    return np.linalg.norm(a.astype(np.float64) - b, axis=-1) / np.linalg.norm(b.astype(np.float64), axis=-1)


def margins(logits):
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return top2[:, 1] - top2[:, 0], 1e-2 * logits.std(axis=-1)


def ours(case, tmp_path, *extra):
    out = tmp_path / "out.safetensors"
    run_tool("--model", case["dir"], "--tokens", ",".join(map(str, case["tokens"])), "--out", out,
             "--generate", GENERATE, "--prompt-len", PROMPT, *extra)
    return load_file(str(out))


def check_rule_m(case, o, label):
    worst = {}
    e = rel_err(o["logits"], case["logits"])
    worst["logits"] = e.max()
    assert o["hidden_states"].shape[0] == len(case["hidden"])
    for l, h in enumerate(case["hidden"]):
        worst[f"hidden[{l}]"] = rel_err(o["hidden_states"][l], h).max()
    print(f"\n[{case['preset']}{label}] max relative error per position: " +
          ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    for k, v in worst.items():
        assert v <= FP32_TOL, f"{k}: relative error {v:.3e} above {FP32_TOL}"
    m, eps = margins(case["logits"])
    decisive = m > eps
    print(f"[{case['preset']}{label}] teacher-forced positions below eps: {(~decisive).sum()}/{len(m)}")
    np.testing.assert_array_equal(o["logits"].argmax(-1)[decisive], case["logits"].argmax(-1)[decisive])
    # Greedy: equal up to the first position where the reference's margin is below eps.
    gm, geps = margins(case["gen_scores"])
    stop = int(np.argmax(gm <= geps)) if (gm <= geps).any() else len(gm)
    print(f"[{case['preset']}{label}] greedy: {len(gm)} tokens, compared up to {stop}; "
          f"ours {o['generated'][:12].tolist()}...")
    np.testing.assert_array_equal(o["generated"][:stop], case["gen_tokens"][:stop])
    assert stop >= GENERATE // 2, "the reference continuation is not decisive enough to test"


def test_teacher_forced_and_greedy(case, tmp_path):
    check_rule_m(case, ours(case, tmp_path), "")


def test_tensor_parallel_2(case, tmp_path):
    check_rule_m(case, ours(case, tmp_path, "--tp-size", 2), " tp2")


def test_decode_path(case, tmp_path):
    # Teacher forced one token at a time (prefill 1, then decode steps): same tolerance.
    check_rule_m(case, ours(case, tmp_path, "--chunk", 1, "--page-size", 4), " decode")


def test_rope_constants(case, tmp_path):
    o = ours(case, tmp_path)
    m = case["model"]
    rot = m.model.rotary_emb
    np.testing.assert_array_equal(o["rope_inv_freq"], rot.inv_freq.numpy())
    np.testing.assert_allclose(o["rope_attention_factor"][0], rot.attention_scaling, rtol=1e-7)
    np.testing.assert_allclose(o["softmax_scale"][0], m.model.layers[0].self_attn.scaling, rtol=1e-7)


def test_bad_checkpoints_fail_cleanly(case, tmp_path):
    def broken(name, edit):
        d = tmp_path / name
        shutil.copytree(case["dir"], d)
        edit(d)
        p = run_tool("--model", d, "--tokens", "1,2,3", "--out", tmp_path / "x.safetensors", check=False)
        assert p.returncode == 1, f"{name}: exit {p.returncode}, stderr {p.stderr}"
        assert "error:" in p.stderr
        return p.stderr

    files = sorted(f for f in os.listdir(case["dir"]) if f.endswith(".safetensors"))

    def truncate(d):
        f = d / files[-1]
        os.truncate(f, os.path.getsize(f) // 2)

    assert files[-1] in broken("truncated", truncate)

    def bad_json(d):
        (d / "config.json").write_text("{\"hidden_size\": ")

    assert "config.json" in broken("bad_json", bad_json)

    def unsupported(d):
        c = json.loads((d / "config.json").read_text())
        c["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
        c.pop("rope_parameters", None)
        (d / "config.json").write_text(json.dumps(c))

    msg = broken("unsupported", unsupported)
    assert "dynamic" in msg and "not supported" in msg
