"""The Hopper (sm_90) wing: FlashAttention forward and backward kernels in Gluon."""
