"""Classifier study for the dpsyn protocol: train on n seeded real fmnist rows (90%; epoch selected on the other
10%), score on 5000 validation rows drawn from the other private rows (never the test split).

    python experiments/dpimagebench/classifier_study.py experiments/dpimagebench/classifier_study.study.tsv name:epochs:n:seed ...

Rows are appended to the tab-separated study file (a study of the protocol, not results: not a .csv under experiments/)."""
import sys, time, csv, os, numpy as np, torch
from torch import nn
from torch.nn import functional as F
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from dpsyn.data.fmnist import read_fashion_mnist
from dpsyn.lit.classifier import train_classifier, predict

torch.set_num_threads(int(os.environ.get("T", "2")))
arr = read_fashion_mnist("/usr/share/datasets/fashion-mnist")
X = (arr.train_x.astype(np.float32) / 255.0)[:, None]
Y = arr.train_y.astype(np.int64)

class Shift(nn.Module):
    def __init__(self, pad=2):
        super().__init__(); self.pad = pad
    def forward(self, x):
        if not self.training: return x
        n, _, h, w = x.shape
        p = F.pad(x, (self.pad,) * 4)
        dx, dy = torch.randint(0, 2 * self.pad + 1, (2,))
        return p[:, :, dy:dy + h, dx:dx + w]

def cnn(norm, drop, width=(32, 64, 64), aug=False, fc=128):
    layers = [Shift()] if aug else []
    c = 1
    for w in width:
        layers += [nn.Conv2d(c, w, 3, padding=1, bias=not norm)]
        if norm: layers += [nn.BatchNorm2d(w)]
        layers += [nn.ReLU(True), nn.MaxPool2d(2)]
        c = w
    layers += [nn.Flatten(), nn.Linear(c * 3 * 3, fc), nn.ReLU(True)]
    if drop: layers += [nn.Dropout(drop)]
    layers += [nn.Linear(fc, 10)]
    return nn.Sequential(*layers)

CANDS = {
  "mid_bn_do": dict(norm=True, drop=0.3, width=(32, 64, 128), fc=256),
  "wide_bn_do_aug": dict(norm=True, drop=0.3, width=(64, 128, 128), fc=256, aug=True),
  "small_cnn": dict(norm=False, drop=0),
  "small_cnn_bn_do": dict(norm=True, drop=0.3),
  "small_cnn_bn_do_aug": dict(norm=True, drop=0.3, aug=True),
  "wide_bn_do": dict(norm=True, drop=0.3, width=(64, 128, 128), fc=256),
}
out = sys.argv[1]
SCHED = os.environ.get("SCHED", "constant"); LR = float(os.environ.get("LR", "1e-3"))
runs = [a.split(":") for a in sys.argv[2:]]  # name:epochs:n:seed
rng = np.random.default_rng([0, 0x7A11D])
perm = rng.permutation(len(X)); val_idx, pool = perm[:5000], perm[5000:]
for name, ep, n, seed in runs:
    ep, n, seed = int(ep), int(n), int(seed)
    r = np.random.default_rng(seed); idx = r.choice(pool, size=n, replace=False)
    ho = max(1, round(n * 0.1)); tr, hv = idx[ho:], idx[:ho]
    torch.manual_seed(seed); net = cnn(**CANDS[name])
    t = time.time()
    fit = train_classifier(net, (X[tr], Y[tr]), (X[hv], Y[hv]), epochs=ep, batch_size=128, lr=LR, seed=seed, progress=False, schedule=SCHED)
    dt = time.time() - t
    acc = float((predict(net, X[val_idx]).argmax(1) == Y[val_idx]).mean())
    row = dict(classifier=name, schedule=SCHED, lr=LR, epochs=ep, n_samples=n, seed=seed, params=sum(p.numel() for p in net.parameters()),
               train_s=round(dt, 1), best_epoch=fit["best_epoch"], heldout_acc=round(fit["val_acc"], 4), val_acc=round(acc, 4),
               cpu=open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip(), threads=torch.get_num_threads())
    print(row, flush=True)
    new = not os.path.exists(out)
    with open(out, "a") as f:
        w = csv.DictWriter(f, fieldnames=list(row), delimiter="\t", lineterminator="\n")
        if new: w.writeheader()
        w.writerow(row)
