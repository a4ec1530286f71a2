"""Models: one shared block and its parts, and a thin recipe per architecture.

Shape letters, the same in every file (a file's `Shapes:` line lists those it uses, sometimes with a note):
- B batch
- T time (tokens per row; the new steps when a cache holds the past; the queries in attention)
- P cached steps
- S key positions (P + T in self-attention; the encoder's time in cross-attention and in an encoder-decoder)
- C channels (the model width)
- H query heads
- K key/value heads
- D head dim
- F inner width (of a feed-forward layer or an expert)
- V vocabulary
- L labels
- O head outputs (labels, vocabulary, ...)
- N tokens (one flat list: B * T, the real tokens of a packed batch, a head's predicted tokens, image patches)
- M choices (multiple choice)
- E experts
- R experts per token (the router's top k)
- A assignments (N * R: one per token and chosen expert)
- G ranks of a process group
- X experts one rank holds (E / G, expert parallelism)
- Ch image channels
- Hi image height
- Wi image width
- Gh patch-grid height
- Gw patch-grid width
"""
