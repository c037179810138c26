"""Where and how our kernels run: Triton's interpreter or the GPU, ahead-of-time builds, the
C++ launcher extension and the CUDA context it needs."""
