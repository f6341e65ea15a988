#!/usr/bin/env bash
# moecore export-hf / import-hf (docs/hf.md), CPU only, no transformers:
#  1. import(export(checkpoint)) is bit-identical in FP32, as one file and as
#     shards with an index, for olmoe (pre-norm) and flex_olmo (post-norm), and
#     training resumes from the imported checkpoint;
#  2. BF16 export holds round-to-nearest-even of the FP32 values;
#  3. memory stays bounded: export and import of a 100 MB model peak far below it;
#  4. malformed inputs and unsupported configs give clear errors, a non-zero
#     exit and no output directory.
set -u
cd "$(dirname "$0")/.."
bin=${MOECORE:-$PWD/build/moecore}
tool=${TOOL_HF_LOGITS:-$PWD/build/tests/tool_hf_logits}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }

"$bin" export-hf --help >/dev/null 2>&1 || { echo "FAIL: $bin has no export-hf command"; exit 1; }

# A safetensors reader by hand (numpy only): tensors of a file or of an HF
# directory (index + shards), by name.
cat >"$tmp/st.py" <<'EOF'
import json, os, struct, sys
import numpy as np
DT = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "I32": np.int32}

def read_file(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], tuple(v["shape"]), b[8 + n + s:8 + n + e])
    return out

def read_any(path):
    if os.path.isfile(path):
        return read_file(path)
    idx = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(idx):
        return read_file(os.path.join(path, "model.safetensors"))
    out = {}
    for f in sorted(set(json.load(open(idx))["weight_map"].values())):
        out.update(read_file(os.path.join(path, f)))
    return out

def write_file(path, tensors, meta={"format": "pt"}):
    h, off, data = {"__metadata__": meta}, 0, b""
    for k, (dt, shape, raw) in tensors.items():
        h[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    hj = json.dumps(h).encode()
    hj += b" " * (-len(hj) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hj)) + hj + data)

def rne(x):  # float32 -> bf16 bits, round to nearest even (no NaN here)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

cmd = sys.argv[1]
if cmd == "same":  # two files / dirs hold the same tensors, bit for bit
    a, b = read_any(sys.argv[2]), read_any(sys.argv[3])
    if set(a) != set(b):
        sys.exit("names differ: %s" % sorted(set(a) ^ set(b))[:5])
    diff = [k for k in a if a[k] != b[k]]
    if diff:
        sys.exit("%d tensors differ, e.g. %s" % (len(diff), diff[0]))
    print("%d tensors bit-identical (%d bytes)" % (len(a), sum(len(v[2]) for v in a.values())))
elif cmd == "bf16":  # every BF16 tensor of dir 3 is RNE of the F32 one of dir 2
    a, b = read_any(sys.argv[2]), read_any(sys.argv[3])
    n = 0
    for k, (dt, shape, raw) in a.items():
        bd, bs, braw = b[k]
        assert dt == "F32" and bd == "BF16" and bs == shape, (k, dt, bd, shape, bs)
        want = rne(np.frombuffer(raw, np.float32).copy())
        got = np.frombuffer(braw, np.uint16)
        if not np.array_equal(want, got):
            sys.exit("%s: %d of %d values are not RNE" % (k, int((want != got).sum()), got.size))
        n += got.size
    print("%d tensors, %d values: BF16 = RNE(FP32)" % (len(a), n))
elif cmd == "widened":  # F32 tensors of file 2 == BF16 tensors of dir 3 widened
    a, b = read_any(sys.argv[2]), read_any(sys.argv[3])
    m = json.load(open(sys.argv[4]))  # HF name -> moecore name, from the index-less export
    for hf, ours in m.items():
        got = np.frombuffer(a[ours][2], np.float32)
        want = (np.frombuffer(b[hf][2], np.uint16).astype(np.uint32) << 16).view(np.float32)
        if not np.array_equal(got[:want.size], want):
            sys.exit("%s: not the widened BF16 of %s" % (ours, hf))
    print("imported BF16 widens exactly")
elif cmd == "drop":  # file without tensor NAME
    t = read_file(sys.argv[2]); del t[sys.argv[4]]; write_file(sys.argv[3], t)
elif cmd == "dtype":  # file with tensor NAME's dtype relabelled (same bytes)
    t = read_file(sys.argv[2]); dt, s, r = t[sys.argv[4]]; t[sys.argv[4]] = (sys.argv[5], s, r)
    write_file(sys.argv[3], t)
elif cmd == "add":  # file with one more F32 tensor NAME of shape [4]
    t = read_file(sys.argv[2]); t[sys.argv[4]] = ("F32", (4,), bytes(16)); write_file(sys.argv[3], t)
elif cmd == "hdrlen":  # header length field says more than the file holds
    b = bytearray(open(sys.argv[2], "rb").read()); b[:8] = struct.pack("<Q", len(b) + 1000)
    open(sys.argv[3], "wb").write(bytes(b))
elif cmd == "json":  # print a key of a JSON file
    v = json.load(open(sys.argv[2]))
    for k in sys.argv[3].split("."):
        v = v[k]
    print(json.dumps(v, sort_keys=True))
elif cmd == "setjson":  # set a top-level key of a JSON file (value as JSON text)
    v = json.load(open(sys.argv[2])); v[sys.argv[3]] = json.loads(sys.argv[4]); json.dump(v, open(sys.argv[2], "w"))
elif cmd == "zero":  # every tensor of a file is zero (and router_bias is there)
    t = read_file(sys.argv[2])
    if "router_bias" not in t or any(any(raw) for _, _, raw in t.values()):
        sys.exit("not all zero, or no router_bias")
    print("%d tensors, all zero (moments and router_bias)" % len(t))
elif cmd == "shards":
    idx = json.load(open(os.path.join(sys.argv[2], "model.safetensors.index.json")))
    files = set(idx["weight_map"].values())
    total = sum(len(v[2]) for v in read_any(sys.argv[2]).values())
    assert idx["metadata"]["total_size"] == total, (idx["metadata"], total)
    print(len(files))
EOF
st() { $py "$tmp/st.py" "$@"; }

# ---- checkpoints: 2 training steps, pre-norm (olmoe) and post-norm (flex_olmo) ----------
"$bin" tokenize --out "$tmp/t.bin" /usr/share/common-licenses/* >/dev/null || { echo "tokenize failed"; exit 1; }
small=(--data.train="$tmp/t.bin" --data.eval="$tmp/t.bin" --model.d_model=64 --model.n_layers=2
       --model.n_experts=4 --model.expert_hidden=64 --model.seq_len=32 --train.global_batch=4
       --train.micro_batch=4 --train.eval_interval=0)
for norm in pre post; do
  "$bin" train configs/tiny.yaml "${small[@]}" --model.norm=$norm --train.steps=2 \
      --logging.run_dir="$tmp/run_$norm" >"$tmp/train_$norm.log" 2>&1 \
      || { cat "$tmp/train_$norm.log"; echo "FAIL: training the $norm checkpoint"; exit 1; }
done
pre="$tmp/run_pre/checkpoints/step-00000002"
post="$tmp/run_post/checkpoints/step-00000002"

# ---- 1. FP32 round trips ---------------------------------------------------------------
roundtrip() { # name, checkpoint, export args...
  local name=$1 ck=$2; shift 2
  local hf="$tmp/hf_$name" imp="$tmp/imp_$name/step-00000000"
  "$bin" export-hf "$ck" "$hf" "$@" >"$tmp/exp_$name.log" 2>&1 || { cat "$tmp/exp_$name.log"; bad "$name: export failed"; return; }
  "$bin" import-hf "$hf" "$imp" >"$tmp/imp_$name.log" 2>&1 || { cat "$tmp/imp_$name.log"; bad "$name: import failed"; return; }
  local r
  if r=$(st same "$ck/model.safetensors" "$imp/model.safetensors" 2>&1); then ok "$name: import(export) $r"
  else bad "$name: round trip differs: $r"; fi
  [ "$(st json "$ck/train_state.json" model)" = "$(st json "$imp/train_state.json" model)" ] \
    && ok "$name: model config restored exactly" || bad "$name: model config differs after the round trip"
}
roundtrip olmoe "$pre"
roundtrip sharded "$pre" --max-shard-size=100KB
roundtrip flex "$post"
[ "$(st json "$tmp/hf_olmoe/config.json" model_type)" = '"olmoe"' ] && ok "pre-norm exports as olmoe" || bad "pre-norm model_type"
[ "$(st json "$tmp/hf_flex/config.json" model_type)" = '"flex_olmo"' ] && ok "post-norm exports as flex_olmo" || bad "post-norm model_type"
[ "$(st json "$tmp/hf_olmoe/config.json" vocab_size)" = 384 ] && ok "config.json vocab_size is the padded 384" || bad "vocab_size"
[ -f "$tmp/hf_olmoe/model.safetensors" ] && [ ! -e "$tmp/hf_olmoe/model.safetensors.index.json" ] \
  && ok "one file under the default shard size" || bad "default export is not one file"
if n=$(st shards "$tmp/hf_sharded" 2>&1) && [ "$n" -gt 1 ] && [ ! -e "$tmp/hf_sharded/model.safetensors" ]; then
  ok "--max-shard-size=100KB: $n shards + index (total_size checked)"
else bad "sharded export: $n"; fi
st same "$tmp/hf_olmoe" "$tmp/hf_sharded" >/dev/null && ok "sharded and single-file exports hold the same tensors" \
  || bad "sharded export differs from the single file"
r=$(st zero "$tmp/imp_olmoe/step-00000000/optim.safetensors" 2>&1) && ok "imported optimizer state: $r" || bad "imported optimizer state: $r"
cmp -s "$pre/model.safetensors" "$tmp/imp_olmoe/step-00000000/model.safetensors" \
  && ok "imported model.safetensors is byte-identical to the original file" || echo "note: same tensors, different file layout"

# training resumes from an imported checkpoint (sharded, and flex_olmo)
for name in sharded flex; do
  norm=pre; [ $name = flex ] && norm=post
  out=$("$bin" train configs/tiny.yaml "${small[@]}" --model.norm=$norm --train.steps=1 \
        --logging.run_dir="$tmp/resume_$name" --checkpoint.dir="$tmp/imp_$name" --resume 2>&1); rc=$?
  if [ $rc -eq 0 ] && grep -q "resume: loaded .*imp_$name/step-00000000 (step 0" <<<"$out" \
     && [ -f "$tmp/imp_$name/step-00000001/COMMITTED" ]; then
    ok "$name: train --resume loaded the imported checkpoint and ran a step ($(grep -o 'loss [0-9.]*' <<<"$out" | head -1))"
  else echo "$out" | tail -5; bad "$name: resume from the imported checkpoint"; fi
done
grep -q "vocab_size: 257" "$tmp/imp_olmoe.log" && grep -q -- "--checkpoint.dir=$tmp/imp_olmoe --resume" "$tmp/imp_olmoe.log" \
  && ok "import prints the model keys and the resume command" || bad "import did not print the model keys"
grep -q "^model:" "$tmp/imp_olmoe/step-00000000/config.yaml" && ok "imported checkpoint has a config.yaml model section" \
  || bad "no config.yaml in the imported checkpoint"

# ---- 2. BF16 -----------------------------------------------------------------------------
if "$bin" export-hf "$pre" "$tmp/hf_bf16" --dtype=bf16 >/dev/null 2>&1; then
  r=$(st bf16 "$tmp/hf_olmoe" "$tmp/hf_bf16" 2>&1) && ok "bf16 export: $r" || bad "bf16 export: $r"
  [ "$(st json "$tmp/hf_bf16/config.json" torch_dtype)" = '"bfloat16"' ] && ok "bf16 config.json torch_dtype bfloat16" || bad "bf16 torch_dtype"
  if "$bin" import-hf "$tmp/hf_bf16" "$tmp/imp_bf16/step-00000000" >/dev/null 2>&1; then
    # HF name -> moecore name for a few tensors, checked both ways
    cat >"$tmp/names.json" <<'EOF'
{"model.embed_tokens.weight": "embed", "lm_head.weight": "lm_head", "model.norm.weight": "final_norm",
 "model.layers.1.self_attn.q_proj.weight": "layers.1.attn.wq", "model.layers.0.self_attn.k_norm.weight": "layers.0.attn.k_norm",
 "model.layers.0.input_layernorm.weight": "layers.0.attn_norm", "model.layers.0.post_attention_layernorm.weight": "layers.0.ffn_norm",
 "model.layers.1.mlp.gate.weight": "layers.1.moe.router", "model.layers.1.mlp.experts.0.down_proj.weight": "layers.1.moe.experts.w_down"}
EOF
    r=$(st widened "$tmp/imp_bf16/step-00000000/model.safetensors" "$tmp/hf_bf16" "$tmp/names.json" 2>&1) \
      && ok "bf16 import: $r" || bad "bf16 import: $r"
  else bad "bf16 import failed"; fi
else bad "bf16 export failed"; fi

# ---- 3. bounded memory ---------------------------------------------------------------------
"$tool" init "$tmp/big" --model.d_model=256 --model.n_layers=2 --model.n_heads=4 --model.n_experts=16 \
    --model.expert_hidden=1024 --model.vocab_size=257 >/dev/null || bad "tool_hf_logits init"
peak() { $py -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024 if r.returncode == 0 else -1)' "$@"; }
size_mb=$(( $(stat -c %s "$tmp/big/step-00000000/model.safetensors") / 1000000 ))
e_mb=$(peak "$bin" export-hf "$tmp/big/step-00000000" "$tmp/hf_big" --max-shard-size=30MB)
i_mb=$(peak "$bin" import-hf "$tmp/hf_big" "$tmp/imp_big/step-00000000")
if [ "$e_mb" -ge 0 ] && [ "$i_mb" -ge 0 ] && [ "$e_mb" -lt $((size_mb / 2)) ] && [ "$i_mb" -lt $((size_mb / 2)) ]; then
  ok "a ${size_mb} MB model: export peaks at ${e_mb} MiB, import at ${i_mb} MiB resident"
else bad "memory: model ${size_mb} MB, export peak ${e_mb} MiB, import peak ${i_mb} MiB"; fi
st same "$tmp/big/step-00000000/model.safetensors" "$tmp/imp_big/step-00000000/model.safetensors" >/dev/null \
  && ok "the ${size_mb} MB model round-trips through 30 MB shards" || bad "big model round trip"

# ---- 4. malformed inputs and unsupported configs --------------------------------------------
expect_fail() { # name, pattern, output path that must not appear, command...
  local name=$1 pattern=$2 dest=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then bad "$name: accepted"; return; fi
  if ! grep -q -- "$pattern" <<<"$out"; then bad "$name: message does not say '$pattern': $out"; return; fi
  if [ -e "$dest" ] || [ -e "$dest.tmp" ]; then bad "$name: left $dest behind"; return; fi
  ok "$name: exit $rc: ${out#moecore: error: }"
}
mkhf() { rm -rf "$tmp/m_$1"; cp -r "$tmp/hf_olmoe" "$tmp/m_$1"; echo "$tmp/m_$1"; }
imp() { "$bin" import-hf "$1" "$tmp/never_$2/step-00000000"; }
gone="model.layers.1.mlp.experts.3.down_proj.weight"

d=$(mkhf missing); st drop "$d/model.safetensors" "$d/model.safetensors" "$gone"
expect_fail "missing tensor" "missing tensor $gone" "$tmp/never_1/step-00000000" imp "$d" 1
d=$(mkhf shape); st setjson "$d/config.json" intermediate_size 32
expect_fail "wrong shape" "gate_proj.weight has shape \[64, 64\], expected \[32, 64\]" "$tmp/never_2/step-00000000" imp "$d" 2
d=$(mkhf dtype); st dtype "$d/model.safetensors" "$d/model.safetensors" model.norm.weight I32
expect_fail "unsupported dtype" "model.norm.weight has dtype I32; import reads F32, BF16 and F16" "$tmp/never_3/step-00000000" imp "$d" 3
d=$(mkhf dtype2); st dtype "$d/model.safetensors" "$d/model.safetensors" model.norm.weight Q4
expect_fail "unknown dtype" 'unknown dtype "Q4"' "$tmp/never_4/step-00000000" imp "$d" 4
d=$(mkhf hdr); st hdrlen "$d/model.safetensors" "$d/model.safetensors"
expect_fail "header larger than the file" "exceeds the file" "$tmp/never_5/step-00000000" imp "$d" 5
rm -rf "$tmp/m_index"; cp -r "$tmp/hf_sharded" "$tmp/m_index"; d="$tmp/m_index"
head -c 100 "$tmp/hf_sharded/model.safetensors.index.json" >"$d/model.safetensors.index.json"
expect_fail "bad index JSON" "model.safetensors.index.json: not valid JSON" "$tmp/never_6/step-00000000" imp "$d" 6
rm -rf "$tmp/m_index2"; cp -r "$tmp/hf_sharded" "$tmp/m_index2"; d="$tmp/m_index2"; rm "$d/model-00002-of-"*.safetensors
expect_fail "index names a missing shard" "model-00002-of-.*safetensors: open: No such file" "$tmp/never_7/step-00000000" imp "$d" 7
rm -rf "$tmp/m_index3"; cp -r "$tmp/hf_sharded" "$tmp/m_index3"; d="$tmp/m_index3"
$py - "$d/model.safetensors.index.json" <<'EOF'
import json, sys
p = sys.argv[1]; j = json.load(open(p)); wm = j["weight_map"]; files = sorted(set(wm.values()))
wm["lm_head.weight"] = [f for f in files if f != wm["lm_head.weight"]][0]; json.dump(j, open(p, "w"))
EOF
expect_fail "weight_map points at the wrong shard" "the weight_map puts lm_head.weight in" "$tmp/never_8/step-00000000" imp "$d" 8
d=$(mkhf noconfig); rm "$d/config.json"
expect_fail "missing config.json" "config.json: cannot open" "$tmp/never_9/step-00000000" imp "$d" 9
d=$(mkhf llama); st setjson "$d/config.json" model_type '"llama"'
expect_fail "unknown model_type" "model_type llama is not supported" "$tmp/never_10/step-00000000" imp "$d" 10
d=$(mkhf bias); st setjson "$d/config.json" attention_bias true
expect_fail "attention_bias" "attention_bias = true is not supported" "$tmp/never_11/step-00000000" imp "$d" 11
d=$(mkhf extra); st add "$d/model.safetensors" "$d/model.safetensors" model.layers.0.self_attn.q_proj.bias
expect_fail "unexpected tensor" "unexpected tensor model.layers.0.self_attn.q_proj.bias" "$tmp/never_12/step-00000000" imp "$d" 12
d=$(mkhf notstep)
expect_fail "checkpoint not named step-N" "is named step-NNNNNNNN" "$tmp/never_12b" "$bin" import-hf "$d" "$tmp/never_12b/mine"
expect_fail "existing CKPT_DIR" "exists (add --force" "$tmp/never_13" "$bin" import-hf "$tmp/hf_olmoe" "$tmp/imp_olmoe/step-00000000"
"$bin" import-hf "$tmp/hf_olmoe" "$tmp/imp_olmoe/step-00000000" --force >/dev/null 2>&1 \
  && ok "--force replaces an existing checkpoint" || bad "--force import"
expect_fail "existing OUT_DIR" "exists (add --force" "$tmp/never_14" "$bin" export-hf "$pre" "$tmp/hf_olmoe"
"$bin" export-hf "$pre" "$tmp/hf_olmoe" --force >/dev/null 2>&1 && [ ! -e "$tmp/hf_olmoe.old" ] \
  && ok "--force replaces an existing export" || bad "--force export"
expect_fail "export over a checkpoint" "holds a moecore checkpoint; not replacing it" "$tmp/never_14b" \
  "$bin" export-hf "$pre" "$tmp/imp_olmoe/step-00000000" --force
[ -f "$tmp/imp_olmoe/step-00000000/COMMITTED" ] || bad "export --force damaged a checkpoint"
mkdir -p "$tmp/uncommitted"; cp "$pre/train_state.json" "$pre/model.safetensors" "$tmp/uncommitted/"
expect_fail "uncommitted checkpoint" "no COMMITTED marker" "$tmp/never_15" "$bin" export-hf "$tmp/uncommitted" "$tmp/never_15"
expect_fail "flex_olmo asked of a pre-norm model" "model.norm = pre cannot be written as flex_olmo" "$tmp/never_16" "$bin" export-hf "$pre" "$tmp/never_16" --format=flex_olmo
expect_fail "bad --dtype" "--dtype: 'fp8' is not one of" "$tmp/never_17" "$bin" export-hf "$pre" "$tmp/never_17" --dtype=fp8
# configs transformers cannot express: refused naming the model.* key
unsupported() { # key, pattern, model args...
  local key=$1 pattern=$2; shift 2
  rm -rf "$tmp/u"
  "$tool" init "$tmp/u" --model.d_model=32 --model.n_layers=2 --model.n_experts=4 --model.expert_hidden=16 "$@" >/dev/null \
    || { bad "tool_hf_logits init $*"; return; }
  expect_fail "unsupported $key" "$pattern" "$tmp/never_u" "$bin" export-hf "$tmp/u" "$tmp/never_u"
}
unsupported model.norm "model.norm = peri has no transformers equivalent" --model.norm=peri
unsupported model.qk_norm "model.qk_norm = head" --model.qk_norm=head
unsupported model.qk_norm "model.qk_norm = none" --model.qk_norm=none
unsupported model.gating "model.gating = sigmoid" --model.gating=sigmoid
unsupported model.dense_layers "model.dense_layers = 1" --model.dense_layers=1
unsupported model.n_experts "model.n_experts = 0" --model.n_experts=0
unsupported model.n_shared "model.n_shared = 1" --model.n_shared=1 --model.shared_hidden=16
unsupported model.aux_free_rate "model.aux_free_rate = 0.001" --model.aux_free_rate=0.001
unsupported model.routing "model.routing = random" --model.routing=random
unsupported model.head_dim "model.head_dim = 16: olmoe derives" --model.head_dim=16
unsupported model.capacity_factor "model.capacity_factor = 1.25" --model.capacity_factor=1.25
# ... while flex_olmo takes a head_dim of its own
rm -rf "$tmp/u"; "$tool" init "$tmp/u" --model.d_model=32 --model.n_layers=2 --model.n_experts=4 --model.expert_hidden=16 \
  --model.norm=post --model.head_dim=16 >/dev/null
"$bin" export-hf "$tmp/u" "$tmp/hf_hd" >/dev/null 2>&1 && "$bin" import-hf "$tmp/hf_hd" "$tmp/imp_hd/step-00000000" >/dev/null 2>&1 \
  && st same "$tmp/u/step-00000000/model.safetensors" "$tmp/imp_hd/step-00000000/model.safetensors" >/dev/null \
  && ok "flex_olmo with head_dim 16 != d_model / n_heads round-trips" || bad "flex_olmo head_dim round trip"

echo
[ $fails -eq 0 ] && echo "test_hf: all checks passed" || echo "test_hf: $fails check(s) failed"
[ $fails -eq 0 ]
