# @header
# @srope-module srope.ops.rotary.kernels
