"""The thirteen stages of the lesson: what each sets up, shows and asks the learner to try;
the last four train the layer (``Rehearsal``: what the Training dock is set to)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rehearsal:
    """A training run a stage sets up: the task, Adam's learning rate, how many steps, and
    the setting a second run from the same start and seed switches ("" for none; "mask":
    causal −∞ against causal-zero, "scale": ÷√d_k on against off)."""

    task: str
    lr: float
    steps: int
    compare: str = ""


@dataclass(frozen=True)
class Stage:
    number: int
    title: str
    preset: str  # the scenario and settings the stage starts from
    docks: tuple[str, ...]  # the panels brought forward, most important first
    explanation: str  # HTML, a few sentences
    try_this: str
    tab: tuple[str, str] | None = None  # (dock, tab): a tab to open in a dock with tabs
    training: Rehearsal | None = None  # the run the Training dock is set up for


STAGES: tuple[Stage, ...] = (
    Stage(
        1,
        "Simple self-attention",
        "stage-1-simple",
        ("Pipeline", "Inputs", "Inspector"),
        "Each token is a row of <b>X</b>. Without any learned weights, a token compares "
        "itself with every token by a dot product: row <i>i</i> of <b>X Xᵀ</b> holds token "
        "<i>i</i>'s scores. Softmax turns each row into weights, and the output row is the "
        "weighted average of the rows of X: <b>out = softmax(X Xᵀ) X</b>. Here Q, K and V "
        "are all just X.",
        "Click a cell of the raw scores: the Inspector shows it is a sum of products of two "
        "rows of X. Then make two rows of X equal and watch their scores.",
    ),
    Stage(
        2,
        "Softmax",
        "stage-2-softmax",
        ("Pipeline", "Inspector", "Experiments"),
        "Softmax makes every score positive and each row sum to 1: "
        "<b>w<sub>ij</sub> = exp(s<sub>ij</sub>) / Σ<sub>k</sub> exp(s<sub>ik</sub>)</b>. "
        "Subtracting the row maximum first changes nothing in the result but keeps exp from "
        "overflowing. Dividing by the plain sum of the scores instead would allow negative "
        "weights, and a row summing to zero would break it.",
        "Click a weight: the Inspector lists the exponentials, their sum and the quotient. "
        "Then multiply one row of X by 10: that token's score with itself grows a hundredfold "
        "and its row of weights becomes one-hot on itself: softmax saturates. (Adding the same "
        "number to every <i>score</i> of a row would change no weight: softmax only sees "
        "differences.)",
    ),
    Stage(
        3,
        "Trainable projections",
        "stage-3-projections",
        ("Pipeline", "Weights", "Inspector"),
        "Attention learns three linear maps with no bias: <b>Q = X W<sub>Q</sub></b> "
        "(what a token looks for), <b>K = X W<sub>K</sub></b> (what it offers) and "
        "<b>V = X W<sub>V</sub></b> (what it passes on). Scores compare queries with keys, "
        "so a token no longer has to attend most to itself.",
        "Look at head 1's weights: no token puts most weight on itself any more. Then copy "
        "the W_Q grid and paste it into W_K: the raw scores become symmetric, S[i, j] = "
        "q<sub>i</sub>·q<sub>j</sub> = S[j, i].",
    ),
    Stage(
        4,
        "Scaling by √d_k",
        "stage-4-scaling",
        ("Experiments", "Pipeline", "Inspector"),
        "With zero-mean, unit-variance entries, a dot product of d_k terms has variance "
        "d_k, so scores grow with the head width and softmax saturates: nearly all weight "
        "on one key, and tiny gradients. Dividing by <b>√d_k</b> brings the variance back "
        "near 1. Scores [2, 1, 0, −1] give weights of about [0.64, 0.24, 0.09, 0.03]; "
        "the same scores times 8 give about [1, 0, 0, 0].",
        "In Experiments, run the variance table for d_k = 2, 64 and 512: unscaled scores "
        "have variance near d_k, scaled ones near 1. Drag the saturation factor. The "
        "<i>Gradients</i> tab shows the price: unscaled, less and less gradient gets back "
        "through softmax as d_k grows (a few times less at d_k = 64, thousands of times at "
        "1024). Then switch <i>Scale</i> off in the toolbar: the scaled scores become the raw "
        "scores, and every row's largest weight grows.",
        tab=("Experiments", "Scaling"),
    ),
    Stage(
        5,
        "The causal mask",
        "stage-5-causal-mask",
        ("Masks", "Pipeline", "Inspector"),
        "A language model must not see the future: token <i>i</i> may attend only to "
        "<i>j ≤ i</i>. The right way sets future scores to <b>−∞</b> before softmax, so they "
        "get weight exactly 0 and the rest still sums to 1. Setting them to 0 instead "
        "leaks: e⁰ = 1, so future tokens still get weight. Zeroing weights after softmax "
        "leaves rows that sum to less than 1. The last row never changes.",
        "In Masks, compare −∞ with zero: read the leak per row. Then use the causality "
        "probe on the second token: under −∞ the first output does not move; under zero it does.",
    ),
    Stage(
        6,
        "Multi-head attention",
        "stage-6-multi-head",
        ("Heads", "Mix", "Weights"),
        "Several heads attend in parallel, each with its own W_Q, W_K and W_V of width d_k. "
        "Their outputs are concatenated in head order and mixed by <b>W<sub>O</sub></b>: "
        "<b>MultiHead(X) = Concat(head<sub>1</sub> … head<sub>h</sub>) W<sub>O</sub></b>. "
        "Different heads can learn different patterns.",
        "In Heads, compare the two heads' weights, then switch one off and watch the final "
        "output in Mix change. Which head contributes most to output dimension 1?",
    ),
    Stage(
        7,
        "The cost of attention",
        "stage-7-cost",
        ("Cost", "Experiments", "Pipeline"),
        "n tokens make an n × n score matrix per head: quadratic in time and memory. "
        "At 128,000 tokens that is about 16 billion scores per head. Fused kernels such as "
        "FlashAttention never store that matrix (memory linear in n) but still do the "
        "quadratic arithmetic. A KV cache keeps each layer's keys and values, 2 × n × d_model "
        "numbers, so generating a token computes one new row of scores.",
        "In Cost, type 128000 as the what-if length. In Experiments (the KV cache tab, "
        "opened for you), step the cache: each new row matches full causal attention.",
        tab=("Experiments", "KV cache"),
    ),
    Stage(
        8,
        "What current models change",
        "stage-8-current-models",
        ("Pipeline", "Weights", "RoPE"),
        "Models of 2024–2026 keep this layer and change four things. <b>Grouped-query "
        "attention</b>: groups of query heads share one key/value head (Llama-3-8B: 32 query "
        "heads over 8), so the KV cache shrinks by the group size. <b>RoPE</b>: instead of "
        "adding positions to X, Q and K are rotated by angles that grow with position, so a "
        "score depends only on how far apart two tokens are. <b>Sliding windows</b> (Mistral, "
        "Gemma) let each query see only the last W keys. <b>Sinks</b> (gpt-oss) add a learned "
        "logit to each row's softmax denominator, so a head may attend to nothing.",
        "In Weights, set <i>KV heads</i> to 1: all four heads now read one K and V "
        "(multi-query attention) and the KV cache in Cost halves again. In RoPE, press "
        "<i>Check the scores</i>: moving every position by 1000 changes no score. Then load "
        "the <i>sliding-window</i> and <i>sinks</i> presets: the weights become a band of 4 "
        "keys, and with sinks each row sums to less than 1.",
    ),
    Stage(
        9,
        "Tiles instead of the n × n matrix",
        "stage-9-tiles",
        ("Tiling", "Cost"),
        "FlashAttention never stores the n × n scores. It takes B<sub>r</sub> query rows at a "
        "time and walks over the keys in tiles of B<sub>c</sub> columns, keeping for each row "
        "only a running maximum <b>m</b>, a running denominator <b>l</b> and an unnormalised "
        "output <b>O</b>. When a tile raises a row's maximum from m<sub>old</sub> to "
        "m<sub>new</sub>, what was summed so far is rescaled by <b>e^(m<sub>old</sub> − "
        "m<sub>new</sub>)</b> before the tile's terms are added: l ← l·e^(m<sub>old</sub> − "
        "m<sub>new</sub>) + Σ e^(s − m<sub>new</sub>), and O likewise with P V. After a block's "
        "last tile, <b>O / l</b> is exactly softmax(S) V: the same output, in memory linear in "
        "n. Under a causal mask the tiles above the diagonal are never computed.",
        "In Tiling, with B_r = B_c = 2, press Step (→) four times: in the last tile, row 4 "
        "(cat) meets a larger score, so its m rises and its l is rescaled by "
        "e^(m<sub>old</sub> − m<sub>new</sub>) before the new terms are added; then the output "
        "equals dense attention. Set B_r and B_c to 1: 16 tiles, the 6 above the diagonal "
        "skipped. Choose float16: the output moves by less than 10⁻³.",
    ),
    Stage(
        10,
        "The leak exploited",
        "stage-10-leak",
        ("Training", "Heads", "Pipeline"),
        "A next-token model learns to predict, at each word, the word after it. Training "
        "scores every position in one pass; if the mask lets a word see the future, the "
        "answer is in its input, and the model can learn to read it instead of learning to "
        "predict. At inference the model generates word by word (the KV cache): the future "
        "is not there to read. Under <b>−∞</b> training and inference see the same past; "
        "under the <b>zero</b> mask every future word gets the score 0, e⁰ = 1, and leaks in.",
        "Press <i>Step</i> in Training: the same layer trains 300 steps on the toy corpus with "
        "the zero mask (what the views show) and with −∞ (dashed), same start, same seed. The "
        "zero mask's training loss falls to about 0.001, far below the 0.77 that −∞ reaches "
        "(what predicting the next word honestly costs on these sentences); its inference loss "
        "climbs past 14, against 0.84. In Heads, the leaky heads keep a quarter to a half of "
        "each row on future words: every future key scores 0, so a head cannot single out the "
        "next word, but the values and embeddings learned to read it from the mix.",
        training=Rehearsal("toy-corpus", 0.02, 300, compare="mask"),
    ),
    Stage(
        11,
        "Saturation stalls learning",
        "stage-11-saturation",
        ("Training", "Pipeline", "Heads"),
        "One head of d_k = 64 without ÷√d_k: each score is a sum of 64 products, with a "
        "standard deviation near 8, so softmax puts nearly all of a row's weight on one key "
        "whatever the weights say. A saturated softmax passes back almost no gradient "
        "(stage 4), so the attention pattern hardly moves.",
        "Press <i>Step</i> in Training: 100 steps of Adam on the previous-token task, unscaled "
        "(the views) and scaled (dashed). Unscaled, the loss stays near chance (ln 12 ≈ 2.5) "
        "and the rows of weights in Pipeline stay almost one-hot, mostly on the wrong letters; "
        "scaled, it falls below 0.25 and most of each row moves onto the letter before.",
        training=Rehearsal("previous-token", 0.01, 100, compare="scale"),
    ),
    Stage(
        12,
        "Heads specialise",
        "stage-12-specialise",
        ("Training", "Heads", "Pipeline"),
        "Each position must name two things at once: the letter before it, and the first "
        "letter in capitals. The two answers need two attention patterns and two different "
        "maps from what is read to what is said (copy a letter; make it a capital), and one "
        "head has only one W_V and W_O. Two heads that start alike end up dividing the work.",
        "Press <i>Step</i> in Training (600 steps). In Heads, one head ends with most of each "
        "row on the previous letter (the diagonal below the main one), the other with nearly "
        "all of it on the first letter (the first column). Drag the snapshot slider back to "
        "watch the patterns form.",
        training=Rehearsal("previous-and-first", 0.01, 600),
    ),
    Stage(
        13,
        "Dropout in training, not at inference",
        "stage-13-dropout",
        ("Training", "Pipeline", "Heads"),
        "Attention dropout zeroes a random share p of the weights while training and scales "
        "the rest by 1/(1 − p), a fresh draw each step, so no head can lean on one exact "
        "pattern. At inference it is off: the model uses all of its weights.",
        "Press <i>Step</i> in Training (300 steps, p = 0.3). The loss the steps saw (with "
        "dropout: “steps, with dropout” under the plot) stays well above the training loss "
        "measured without it; the held-out and inference curves, without dropout, follow the "
        "latter.",
        training=Rehearsal("toy-corpus", 0.02, 300),
    ),
)
