# Temporary (H2): CUDA check of the transformers extractor; deleted after the device run.
import sys, torch
sys.path.insert(0, "remote_scripts")
from common.verifier import load_verifier, locate_decoder
from safetensors.torch import load_file
from datasets import load_from_disk
m = load_verifier("/tmp/g/v", device="cuda:0"); p = locate_decoder(m); print("dtype", next(m.parameters()).dtype)
ds = load_from_disk("/tmp/g/p"); ds.set_format("torch")
p.text_model.norm = torch.nn.Identity()
worst = 0.0
for i in [0, 3, 100, 500, 999]:
    ids = ds[i]["input_ids"]
    f = load_file(f"/tmp/g/hs/hs_{i}.safetensors"); g = load_file(f"/tmp/g/hs2/hs_{i}.safetensors")
    with torch.no_grad():
        hs = m(input_ids=ids[None].cuda(), output_hidden_states=True).hidden_states
    ref = torch.stack([hs[2][0], hs[4][0], hs[5][0], hs[8][0]], 1).float().cpu()
    err = (f["hidden_states"].float() - ref).abs().max().item() / ref.abs().max().item()
    worst = max(worst, err)
    assert torch.equal(f["token_ids"], ids) and f["hidden_states"].dtype == torch.bfloat16
    d12 = (f["hidden_states"].float() - g["hidden_states"].float()).abs().max().item() / ref.abs().max().item()
    print(i, tuple(f["hidden_states"].shape), f"rel err vs reference {err:.4f}, batch16 vs batch7 {d12:.4f}")
assert worst < 0.03, worst
print("GPU CHECK OK")
