"""How many of the oldest tokens a streaming KIVI cache holds quantized, from the rules
(KIVI Algorithm 1 as the cache applies them on every append, before attention reads it):

  keys, key_flush="batch": when the key residual reaches max(R, G) tokens, all of them are
        quantized, in groups of G;
  keys, key_flush="group": when the key residual exceeds R (and holds at least G), the oldest
        G keys are quantized;
  values: when the value residual would exceed R, the oldest value is quantized.

Key groups always cover tokens [gG, (g+1)G), so both policies store the same codes and differ
only in when. After n appended tokens, query n - 1 attends to keys [0, keys_quantized_after(n))
and values [0, values_quantized_after(n)) dequantized and to the rest in full precision.
"""

KEY_FLUSH_POLICIES = ("batch", "group")


def check_config(group_size: int, residual: int, key_flush: str) -> None:
    if group_size < 1:
        raise ValueError("group_size = %d, expected >= 1" % group_size)
    if residual < 0 or residual % group_size:
        raise ValueError("residual = %d must be a non-negative multiple of group_size = %d" % (residual, group_size))
    if key_flush not in KEY_FLUSH_POLICIES:
        raise ValueError("key_flush = %r, expected one of %s" % (key_flush, ", ".join(KEY_FLUSH_POLICIES)))


def keys_quantized_after(n: int, group_size: int, residual: int, key_flush: str = "batch") -> int:
    """Keys held quantized after n appends (a multiple of group_size)."""
    check_config(group_size, residual, key_flush)
    G, R = group_size, residual
    if key_flush == "batch":
        r = max(R, G)  # the residual is flushed whole each time it reaches r
        return n // r * r
    trigger = max(R + 1, G)  # residual size at which the oldest G keys go
    if n < trigger:
        return 0
    return ((n - trigger) // G + 1) * G


def values_quantized_after(n: int, residual: int) -> int:
    """Values held quantized after n appends: all but the last R."""
    if residual < 0:
        raise ValueError("residual = %d, expected >= 0" % residual)
    return max(0, n - residual)
