#!/usr/bin/env bash
# The FP8 reference (src/ops/fp8.h) against PyTorch's float8_e4m3fn: decoding
# of all 256 codes, the encoding of 3 x 2^20 FP32 values around every E4M3
# midpoint and exponent, and the block128 (1x128) and MXFP8 quantisation of
# mixed tiles, each recomputed with torch ops (clamp to +-448, then the
# float8_e4m3fn cast, which rounds to nearest even). Needs a python3 whose
# torch has float8_e4m3fn (2.1 or newer); skipped with a message otherwise
# (Debian's python3-torch 1.13 has none). Bit-exact comparisons.
set -eu
cd "$(dirname "$0")/.."
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch; torch.float8_e4m3fn' >/dev/null 2>&1; then py=$p; break; fi
done
if [ -z "$py" ]; then
  echo "skipped: no python3 with torch.float8_e4m3fn here (the comparison runs where one exists)"
  exit 0
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
build/tests/tool_fp8_dump "$dir"
"$py" - "$dir" <<'PY'
import sys, numpy as np, torch
d = sys.argv[1]
def load(name, dt): return torch.from_numpy(np.fromfile(f"{d}/{name}", dtype=dt).copy())
fails = 0
def check(what, ok, detail=""):
    global fails
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else "  " + detail))
    fails += 0 if ok else 1

# decoding
codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
tdec = codes.view(torch.float8_e4m3fn).float()
dec = load("dec.f32", np.float32)
same = (tdec == dec) | (torch.isnan(tdec) & torch.isnan(dec))
check("decode all 256 codes", bool(same.all()), f"{int((~same).sum())} differ")

def encode(x):  # saturating RNE encoding with torch; NaN -> 0x7f
    q = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(x), torch.full_like(q, 0x7f), q)

x = torch.from_numpy(np.fromfile(f"{d}/enc_in.f32", dtype=np.float32).copy())
want = encode(x)
got = load("enc_out.u8", np.uint8)
bad = (want != got)
check(f"encode {x.numel()} FP32 values", not bool(bad.any()),
      f"{int(bad.sum())} differ, e.g. x={x[bad][:4].tolist()} ours={got[bad][:4].tolist()} torch={want[bad][:4].tolist()}")

# block128 1x128
x = load("b128_x.f32", np.float32).view(64, 1024)
tiles = x.view(64, 8, 128)
a = torch.where(torch.isnan(tiles), torch.zeros_like(tiles), tiles.abs()).amax(dim=2)
a = a.clamp(max=torch.finfo(torch.float32).max).clamp(min=2.0 ** -100)
s = a / 448.0
q = encode(tiles / s.unsqueeze(2)).view(64, 1024)
gs = load("b128_s.f32", np.float32).view(64, 8)
gq = load("b128_q.u8", np.uint8).view(64, 1024)
check("block128 1x128 scales", bool((s.view(torch.int32) == gs.view(torch.int32)).all()))
check("block128 1x128 values", bool((q == gq).all()), f"{int((q != gq).sum())} differ")

# MXFP8
x = load("mx_x.f32", np.float32).view(64, 32, 32)
hasnan = torch.isnan(x).any(dim=2)
a = torch.where(torch.isnan(x), torch.zeros_like(x), x.abs()).amax(dim=2)
m, e = torch.frexp(a)          # a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
fl = e - 1
fl = torch.where(torch.isinf(a), torch.full_like(fl, 128), fl)
fl = torch.where(a == 0, torch.full_like(fl, -1000), fl)
ex = (fl - 8).clamp(-127, 127)
sb = torch.where(hasnan, torch.full_like(ex, 255), ex + 127).to(torch.uint8)
inv = torch.pow(torch.tensor(2.0, dtype=torch.float64), (-ex).double()).float()
q = encode(x * inv.unsqueeze(2)).view(64, 1024)
check("MXFP8 E8M0 scales", bool((sb.view(64, 32) == load("mx_s.u8", np.uint8).view(64, 32)).all()))
gq = load("mx_q.u8", np.uint8).view(64, 1024)
check("MXFP8 values", bool((q == gq).all()), f"{int((q != gq).sum())} differ")
if hasattr(torch, "float8_e8m0fnu"):
    t = sb.view(-1).view(torch.float8_e8m0fnu).float()
    ours = torch.where(sb.view(-1) == 255, torch.tensor(float("nan")), torch.pow(torch.tensor(2.0, dtype=torch.float64), sb.view(-1).double() - 127).float())
    same = (t == ours) | (torch.isnan(t) & torch.isnan(ours))
    check("E8M0 scale bytes decode as torch.float8_e8m0fnu", bool(same.all()))
print(f"torch {torch.__version__}: {fails} failed")
sys.exit(1 if fails else 0)
PY
