// One Llama- or Gemma-family decoder layer in one call: the same kernels the Python layer
// calls, in the same order on the same buffers, so the same bits, without the ~150 us of Python
// and ctypes glue per layer that a batch-1 decode step otherwise spends (~40 % of it on the
// embedded model).
//
// Sequence (models/llama.py's DecoderLayer, models/gemma.py's GemmaDecoderLayer, with the
// native kernels; [..] where the Layer has that piece, see its fields):
//   h = rms_norm(x) and residual = x         (first layer)
//   h, residual = add_rms_norm(x, residual)  (later layers: residual += x in place)
//   qkv = linear(h); [q, k = head norms (Qwen3, Gemma 3)]; rotary on q and k in place (the
//   layer's own tables: Gemma's sliding and global layers differ); attention (stores k/v in
//   the pool; window, soft-cap) -> att
//   x = o_proj(att); [x = rms_norm(x) (Gemma)]; h, residual = add_rms_norm(x, residual)
//   gu = gate_up(h); act = silu(g) * u (Llama) or gelu_tanh(g) * u (Gemma); x = down(act)
//   [x = rms_norm(x) (Gemma)]
// The caller adds the final norm.

#include <stdint.h>
#include <string.h>

extern "C" {
int rs_int8_linear(const float* x, int64_t M, int64_t K, const int8_t* packed,
                   const int32_t* comp, const float* ws, const float* bias, int64_t N, float* y,
                   int64_t ldy);
struct BlockPart;
int rs_block_linear(const float* x, int64_t M, int64_t K, const BlockPart* parts,
                    int64_t nparts, float* y, int64_t ldy);
int rs_paged_attention(const float* q, int64_t ldq, const float* k_new, int64_t ldk,
                       const float* v_new, int64_t ldv, const int64_t* slots, void* k_pool,
                       void* v_pool, int64_t kv_dtype, const int64_t* table,
                       int64_t table_stride, const int64_t* row_seq, const int64_t* row_len,
                       const int64_t* row_pos, int64_t T, int64_t H, int64_t KVH, int64_t d,
                       int64_t bs, float scale, int64_t window, float softcap,
                       const float* sinks, float* out);
void rs_rms_norm(const float* x, int64_t ldx, const float* w, int64_t M, int64_t K, float eps,
                 float* out, int64_t ldo);
void rs_add_rms_norm(const float* x, float* residual, const float* w, int64_t M, int64_t K,
                     float eps, float* out);
void rs_rotary(float* q, int64_t ldq, int64_t q_heads, float* k, int64_t ldk, int64_t k_heads,
               int64_t M, int64_t d, const int64_t* positions, const float* cos,
               const float* sin);
void rs_silu_mul(const float* gu, int64_t M, int64_t I, float* out);
void rs_gelu_tanh_mul(const float* gu, int64_t M, int64_t I, float* out);
void rs_head_rms_norm(const float* x, int64_t ldx, const float* w, int64_t M, int64_t heads,
                      int64_t d, float eps, float* out, int64_t ldo);
}

namespace {

// A linear layer's weights as the native kernels hold them. kind 0: int8 (packed, comp,
// scale, bias); kind 1: GGUF blocks (packed: nparts BlockParts, block_linear.cpp).
struct Linear {
  int64_t kind, in_features, out_features;
  const void* packed;
  const int32_t* comp;
  const float* scale;
  const float* bias;
  int64_t nparts;
};

enum Activation : int64_t { kSilu = 0, kGeluTanh = 1 };

// Per layer, fixed at load (the rope tables: until the engine resets them). A null norm is a
// piece the layer does not have.
struct Layer {
  Linear qkv, o, gate_up, down;
  const float* input_norm;
  const float* post_norm;      // before the MLP, added to the residual (Gemma's pre-feedforward)
  const float* attn_out_norm;  // on the attention's output (Gemma's post-attention norm)
  const float* mlp_out_norm;   // on the MLP's output (Gemma's post-feedforward norm)
  const float* q_norm;         // per head [head_dim] (Qwen3, Gemma 3), with k_norm
  const float* k_norm;
  const float* cos;  // rope tables [positions, head_dim]
  const float* sin;
  void* k_pool;
  void* v_pool;
  int64_t kv_dtype;  // the pools' elements (paged_attention.cpp)
  int64_t hidden, heads, kv_heads, head_dim, intermediate, block_size;
  float eps, scale;
  int64_t window;  // sliding-window attention over the last `window` tokens; 0: none (Mistral)
  float softcap;   // attention scores capped to softcap * tanh(s / softcap); 0: none (Gemma 2)
  int64_t activation;  // Activation
};

// Per step, shared by every layer: the rows, their metadata and the activation buffers.
struct Step {
  int64_t rows;
  const int64_t* positions;
  const int64_t* slots;
  const int64_t* table;
  int64_t table_stride;
  const int64_t* row_seq;
  const int64_t* row_len;
  float* x;         // [rows, hidden]: the layer's input, then its output
  float* residual;  // [rows, hidden]
  float* h;         // [rows, hidden]
  float* qkv;       // [rows, (heads + 2 kv_heads) * head_dim]
  float* att;       // [rows, heads * head_dim]
  float* gate_up;   // [rows, 2 * intermediate]
  float* act;       // [rows, intermediate]
};

int linear(const Linear& w, const float* x, int64_t M, float* y) {
  if (w.kind == 1)
    return rs_block_linear(x, M, w.in_features, (const BlockPart*)w.packed, w.nparts, y,
                           w.out_features);
  return rs_int8_linear(x, M, w.in_features, (const int8_t*)w.packed, w.comp, w.scale, w.bias,
                        w.out_features, y, w.out_features);
}

}  // namespace

extern "C" {

// The layer's attention half: norm (and residual), qkv, rotary, attention, o_proj into s->x.
// A tensor-parallel rank sums s->x over the ranks between the halves (its o_proj holds its
// heads' share of the input: models/native_stack.py). Returns 0, or nonzero when a kernel
// failed (1: a linear's scratch memory, 2: bad attention shapes).
int rs_decoder_attention(const Layer* L, const Step* s, int first) {
  const int64_t M = s->rows, D = L->hidden, hd = L->head_dim;
  const int64_t q_width = L->heads * hd, kv_width = L->kv_heads * hd;
  const int64_t qkv_width = q_width + 2 * kv_width;
  if (first) {
    memcpy(s->residual, s->x, (size_t)(M * D) * sizeof(float));
    rs_rms_norm(s->x, D, L->input_norm, M, D, L->eps, s->h, D);
  } else {
    rs_add_rms_norm(s->x, s->residual, L->input_norm, M, D, L->eps, s->h);
  }
  if (linear(L->qkv, s->h, M, s->qkv)) return 1;
  float* q = s->qkv;
  float* k = s->qkv + q_width;
  float* v = k + kv_width;
  if (L->q_norm) {
    rs_head_rms_norm(q, qkv_width, L->q_norm, M, L->heads, hd, L->eps, q, qkv_width);
    rs_head_rms_norm(k, qkv_width, L->k_norm, M, L->kv_heads, hd, L->eps, k, qkv_width);
  }
  rs_rotary(q, qkv_width, L->heads, k, qkv_width, L->kv_heads, M, hd, s->positions, L->cos,
            L->sin);
  if (rs_paged_attention(q, qkv_width, k, qkv_width, v, qkv_width, s->slots, L->k_pool,
                         L->v_pool, L->kv_dtype, s->table, s->table_stride, s->row_seq,
                         s->row_len, s->positions, M, L->heads, L->kv_heads, hd, L->block_size,
                         L->scale, L->window, L->softcap, nullptr, s->att))
    return 2;
  return linear(L->o, s->att, M, s->x);
}

// The layer's MLP half: post-attention norm (residual += x; Gemma first norms the attention's
// output), gate_up, SiLU or tanh-GELU * up, down into s->x (a tensor-parallel rank's share of
// the sum, as above; Gemma's norm of the MLP output needs the whole sum, so tensor parallel
// refuses Gemma: distributed/tp_shard.py).
int rs_decoder_mlp(const Layer* L, const Step* s) {
  const int64_t M = s->rows, D = L->hidden;
  if (L->attn_out_norm) {
    rs_rms_norm(s->x, D, L->attn_out_norm, M, D, L->eps, s->h, D);
    rs_add_rms_norm(s->h, s->residual, L->post_norm, M, D, L->eps, s->h);
  } else {
    rs_add_rms_norm(s->x, s->residual, L->post_norm, M, D, L->eps, s->h);
  }
  if (linear(L->gate_up, s->h, M, s->gate_up)) return 1;
  if (L->activation == kGeluTanh)
    rs_gelu_tanh_mul(s->gate_up, M, L->intermediate, s->act);
  else
    rs_silu_mul(s->gate_up, M, L->intermediate, s->act);
  if (linear(L->down, s->act, M, s->x)) return 1;
  if (L->mlp_out_norm) rs_rms_norm(s->x, D, L->mlp_out_norm, M, D, L->eps, s->x, D);
  return 0;
}

// Runs one layer (see the header); `first` for layer 0. Returns 0, or nonzero when a kernel
// failed (no memory, bad attention shapes).
int rs_decoder_layer(const Layer* L, const Step* s, int first) {
  int rc = rs_decoder_attention(L, s, first);
  return rc ? rc : rs_decoder_mlp(L, s);
}

}  // extern "C"
