// Package nccl binds NCCL and the CUDA runtime for gorovod's GPU backend.
//
// Both libraries are loaded with dlopen when a program asks for them (LoadRuntime, Load),
// never linked, so every gorovod binary builds and runs on machines without CUDA; there the
// loaders return a *LibraryNotFoundError that lists every place looked, and the CPU backend
// keeps working. No NCCL or CUDA header is needed at build time: the few types and enum
// values the binding uses are declared here, checked against nccl.h and the CUDA runtime
// API reference (see types.go).
//
// CUDA's current device is per OS thread, and goroutines move between threads, so every call
// that depends on it locks the goroutine to its thread, selects the device and makes the call
// there (Runtime.onDevice). Each communicator owns its CUDA stream. Libraries stay loaded for
// the life of the process: unloading the CUDA runtime under live contexts is undefined.
package nccl
