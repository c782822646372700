"""A script without a main guard whose import ends the process (sys.exit(5)): given as --impl, one usage line."""
import sys

sys.exit(5)


def layer_norm(x, normalized_shape, weight, bias, eps):  # (never reached)
    return x
