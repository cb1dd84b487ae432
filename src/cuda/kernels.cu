/*
 * kernels.cu - the translation unit nvcc builds into the fatbin that
 * libweft embeds (src/cuda/Makefile.inc): the kernels of kernels_body.h.
 */
#include "src/cuda/kernels_body.h"
