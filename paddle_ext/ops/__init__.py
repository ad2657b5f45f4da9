"""Custom operators: Python APIs with argument checks over the op library."""

from paddle_ext.ops._checks import InvalidArgumentError
from paddle_ext.ops._library import OpLibraryError, get_num_threads, set_num_threads, thread_pool
from paddle_ext.ops.attention_scores import calc_reduced_attention_scores
from paddle_ext.ops.c_embedding import c_embedding
from paddle_ext.ops.flash_attention import flash_attention, flash_attn_unpadded
from paddle_ext.ops.flash_attention_packed import flash_attn_qkvpacked, flash_attn_varlen_qkvpacked
from paddle_ext.ops.rotary import fused_rotary_position_embedding

__all__ = ["InvalidArgumentError", "OpLibraryError", "c_embedding", "calc_reduced_attention_scores",
           "flash_attention", "flash_attn_qkvpacked", "flash_attn_unpadded", "flash_attn_varlen_qkvpacked",
           "fused_rotary_position_embedding", "get_num_threads", "set_num_threads", "thread_pool"]
