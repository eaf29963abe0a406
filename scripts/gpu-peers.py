# PyTorch + diffusers on the same `edgeplan synth` weights, in the same run as `scripts/bench-gpu`:
# one denoiser evaluation (batch 1, 300 tokens, timestep 500) per dtype and size, and the GPU's
# matrix peaks measured through torch (8192³ products). Usage: gpu-peers.py TRANSFORMER_DIR
import sys, time, torch
from diffusers import PixArtTransformer2DModel
path = sys.argv[1]
def med(f, reps=5):
    f(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - a)
    ts.sort(); return ts[len(ts) // 2]
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.float16); b = torch.randn_like(a)
print(f"peak fp16 matmul {n}^3 (torch): {2*n**3/med(lambda: a @ b)/1e12:.0f} TFLOP/s", flush=True)
ai = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8); bi = torch.randint(-128, 127, (n, n), device="cuda", dtype=torch.int8)
print(f"peak int8 matmul {n}^3 (torch._int_mm): {2*n**3/med(lambda: torch._int_mm(ai, bi))/1e12:.0f} TOP/s", flush=True)
af = a.float(); bf = b.float()
print(f"peak fp32 matmul {n}^3 (no tf32): {2*n**3/med(lambda: af @ bf)/1e12:.1f} TFLOP/s", flush=True)
del a, b, ai, bi, af, bf
for dtype in [torch.float16, torch.bfloat16, torch.float32]:
    m = PixArtTransformer2DModel.from_pretrained(path, torch_dtype=dtype).cuda().eval()
    for px in [512, 1024]:
        h = px // 8
        x = torch.randn(1, 4, h, h, device="cuda", dtype=dtype)
        enc = torch.randn(1, 300, 4096, device="cuda", dtype=dtype)
        ts = torch.tensor([500.0], device="cuda")
        with torch.no_grad():
            s = med(lambda: m(x, encoder_hidden_states=enc, timestep=ts,
                              added_cond_kwargs={"resolution": None, "aspect_ratio": None}, return_dict=False))
        print(f"torch {str(dtype)[6:]} {px}x{px}: NFE {s:.4f} s", flush=True)
    del m; torch.cuda.empty_cache()
