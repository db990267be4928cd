"""Summary of the discriminator probe runs in a folder (every sub-folder with a metrics.jsonl): ranking AUC of
replaced over original tokens along training, and how far each exported discriminator's logits move when one
word of a fixed sentence is swapped, and how peaked their last-layer attention is on that sentence. Used by
probe_discriminator.sh; `python -m experiments.probe_discriminator_summary OUT`."""
import math
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, ElectraForPreTraining

from experiments.probe_metrics import prior_entropy, read_rows, tail_mean, window_mean  # noqa: E402

out = Path(sys.argv[1])
runs = sorted(p.parent.name for p in out.glob("*/metrics.jsonl"))
marks = [1, 100, 250, 500, 1000, 1500]

print("| run | " + " | ".join(f"AUC @ {m}" for m in marks) + " | L_D, last 100 | prior entropy H(replaced share) "
      "| replaced-token acc, last 100 |")
print("|---|" + "---|" * (len(marks) + 3))
for name in runs:
    rows = read_rows(out / name / "metrics.jsonl")
    steps = rows[-1]["step"]
    aucs = [f"{window_mean(rows, 'replaced_auc', m):.3f}" if m <= steps else "—" for m in marks]
    print(f"| {name} | " + " | ".join(aucs) + f" | {tail_mean(rows, 'discriminator_loss'):.3f} | "
          f"{prior_entropy(tail_mean(rows, 'replaced_fraction')):.3f} | {tail_mean(rows, 'replaced_accuracy'):.3f} |")

# Does the trained discriminator respond to its input at all? Swap one word of a fixed sentence at a time (to
# "the", or "of" where it is "the") and measure how far the logits move, at that token and elsewhere. Attention
# entropy (mean over heads and positions, last layer) shows whether attention works: log(n) means uniform.
sentence = ("the city of paris is the capital of france and its largest city with a population of two million "
            "people in the year")
print("\n| run | mean abs. logit change at the swapped token | mean over swaps of the largest change elsewhere "
      "| last-layer attention entropy (nats) | uniform attention (nats) |")
print("|---|---|---|---|---|")
for name in runs:
    directory = out / name / "discriminator"
    if not directory.is_dir():
        continue
    model = ElectraForPreTraining.from_pretrained(str(directory), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    the, of = tokenizer.convert_tokens_to_ids("the"), tokenizer.convert_tokens_to_ids("of")

    def forward(x, attentions=False):
        with torch.no_grad():
            return model(input_ids=x, attention_mask=torch.ones_like(x), position_ids=torch.arange(n)[None],
                         token_type_ids=torch.zeros_like(x), output_attentions=attentions)

    first = forward(ids, attentions=True)
    base = first.logits[0]
    last_layer = first.attentions[-1][0]  # (heads, n, n), rows sum to 1
    attention_entropy = -(last_layer * last_layer.clamp_min(1e-12).log()).sum(-1).mean().item()
    at_token, elsewhere = [], []
    for s in range(1, n - 1):  # not [CLS] / [SEP]
        swapped = ids.clone()
        swapped[0, s] = of if ids[0, s] == the else the
        change = (forward(swapped).logits[0] - base).abs()
        at_token.append(change[s].item())
        elsewhere.append(torch.cat([change[1:s], change[s + 1:n - 1]]).max().item())
    print(f"| {name} | {sum(at_token) / len(at_token):.3f} | {sum(elsewhere) / len(elsewhere):.3f} "
          f"| {attention_entropy:.2f} | {math.log(n):.2f} |")
