// Token (+ position) embedding: out (B·T, C) = wte[tokens] (+ wpe[t]). GPT-2 has both tables;
// a Llama has no learned positions (wpe = -1: RoPE rotates q and k inside attention instead).
// Saved: "tokens".
//
// Vocabulary-parallel (Megatron's VocabParallelEmbedding, models/layers/tensor_parallel.h): wte
// holds this rank's rows [vocab_offset, vocab_offset + rows) of the vocabulary; each rank looks
// up its own tokens (the others' give zero rows), the partial embeddings are all-reduced over the
// tp group, the replicated wpe is added, and under sequence parallelism this rank's tokens are
// kept (LanguageModelEmbedding's scatter_to_sequence_parallel_region). Saved: "tokens" as this
// rank's local ids (−1 where another rank's).
#pragma once

#include "models/layers/context.h"

namespace memtrade {

struct Embedding {
  ParamIndex wte = -1;            // (V, C), also the output head when tied; (V / tp, C) when split
  ParamIndex wpe = -1;            // (block_size, C); -1: none
  bool vocab_parallel = false;    // wte is this rank's rows of the vocabulary
  std::int64_t vocab_offset = 0;  // its first row
  // Gemma 2 (transformers 4.46.3 modeling_gemma2.py Gemma2Model.forward): the embeddings times
  // normalizer = √hidden_size as a tensor of the embeddings' dtype (so rounded to it under pure
  // 16-bit precision), in place; its gradient likewise. 0: none.
  float scale = 0.0f;
};

// tokens (B, T) I32 -> returns (B·T, C) in the activation dtype, or under autocast in the
// weights' (fp32) (category activations: it is the residual stream). A copy of the tokens is saved
// when training.
Tensor embedding_forward(LayerCtx& c, const Tensor& tokens, const Embedding& e);
// Scatters dout (B·T, C) (reshaped in place and back) into the wte and wpe gradients; each honours
// its own accumulate flag (wte's is true here when the tied head already wrote into it).
void embedding_backward(LayerCtx& c, Tensor& dout, const Embedding& e);

}  // namespace memtrade
