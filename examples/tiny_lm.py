"""A tiny decoder-only transformer for the examples, built in code (no
downloads): token and position embeddings, pre-norm blocks of causal
self-attention and an MLP, a final norm and an output head; bf16 weights,
about 30k parameters, so a trainer step and a batch of generation take
milliseconds on a CPU.

It learns a toy language: arithmetic progressions modulo the vocabulary
(5, 8, 11, 14, ...), so a few training steps visibly change what it
generates.  trainer_torch.py trains and publishes it; rollout_worker.py
generates with the published weights."""
import math

import torch
import torch.nn.functional as F

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 64, 32, 32, 2, 2


class Block(torch.nn.Module):
    """One pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=-1)
        q, k, v = (y.view(b, t, self.heads, w // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(w // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(torch.nn.Module):
    """The model: tokens [batch, time] (int64, time <= CONTEXT) -> logits
    [batch, time, VOCAB].  Every parameter is bf16 (dtype=) and has a name
    that the trainer publishes and the worker binds; no buffers."""

    def __init__(self, dtype=torch.bfloat16):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, WIDTH)
        self.pos = torch.nn.Embedding(CONTEXT, WIDTH)
        self.blocks = torch.nn.ModuleList(Block(WIDTH, HEADS) for _ in range(LAYERS))
        self.ln = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.to(dtype)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def progressions(gen, batch, length):
    """`batch` sequences of the toy language (int64 [batch, length]): each an
    arithmetic progression mod VOCAB with a random start and stride 1..4."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=gen)
    stride = torch.randint(1, 5, (batch, 1), generator=gen)
    return (start + stride * torch.arange(length)) % VOCAB


def train_step(model, opt, gen, batch=16):
    """One optimizer step of next-token prediction; returns the loss."""
    seq = progressions(gen, batch, CONTEXT)
    logits = model(seq[:, :-1])
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


@torch.no_grad()
def generate(model, prompts, new_tokens):
    """Greedy decoding: returns (tokens [batch, prompt + new_tokens], logits
    [new_tokens, batch, VOCAB]), the logits each new token was chosen from.
    Every step runs the model on the whole prefix (no cache), so a replay
    of the same tokens with the same weights computes the same logits."""
    tokens, steps = prompts, []
    for _ in range(new_tokens):
        logits = model(tokens)[:, -1]
        steps.append(logits)
        tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return tokens, torch.stack(steps)


@torch.no_grad()
def replay(model, tokens, prompt_len):
    """The logits generate() would have computed for `tokens` (a finished
    batch) with `model`'s weights: the same prefixes, step by step."""
    return torch.stack([model(tokens[:, :n])[:, -1] for n in range(prompt_len, tokens.shape[1])])
