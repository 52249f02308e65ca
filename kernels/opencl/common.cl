// common.cl: prelude of the one OpenCL program that holds every cleave kernel
// (the .cl files are concatenated in the order device/opencl/CMakeLists.txt
// lists them, this file first).
//
// Contraction of a*b+c into fma is switched off so results round like the CPU
// backend's, which is the reference the parity tests compare against.
#pragma OPENCL FP_CONTRACT OFF
