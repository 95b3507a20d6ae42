// Package parallel splits a large host-memory pass (a copy, a conversion) over a few
// goroutines. One core's memcpy moves a few GB/s, several times less than the DMA of a
// PCIe 5.0 x16 link (54 GB/s measured on an H200, README's GPUs section), so a single-threaded
// pass over a staging buffer, not the transfer, would bound the step.
package parallel

import (
	"runtime"
	"sync"
	"unsafe"
)

// MaxWorkers caps the goroutines of one pass: beyond about eight, one socket's memory
// bandwidth, not the cores, is the limit.
const MaxWorkers = 8

// minPiece is the smallest part of a pass worth a goroutine of its own (its start and the
// wait cost microseconds; a megabyte costs hundreds of them).
const minPiece = 1 << 20

// Workers is how many goroutines one of localSize processes sharing this machine should
// use: its share of GOMAXPROCS, at least one, at most MaxWorkers.
func Workers(localSize int) int {
	return max(1, min(MaxWorkers, runtime.GOMAXPROCS(0)/max(1, localSize)))
}

// For calls f on consecutive ranges [lo, hi) covering [0, n), with up to workers calls at
// once, each range a multiple of align elements long (but the last) and, where work allows,
// at least minPiece bytes (elemBytes per element). It returns when every call has returned.
func For(n, elemBytes, align, workers int, f func(lo, hi int)) {
	parts := min(workers, n*elemBytes/minPiece)
	if parts <= 1 {
		f(0, n)
		return
	}
	piece := (n + parts - 1) / parts
	piece = (piece + align - 1) / align * align
	var wg sync.WaitGroup
	for lo := piece; lo < n; lo += piece {
		wg.Go(func() { f(lo, min(lo+piece, n)) })
	}
	f(0, min(piece, n))
	wg.Wait()
}

// Overlap reports whether a and b share at least one byte. Copy, Gather and Scatter split their
// work over goroutines, so, unlike copy, they need a destination that does not overlap its
// source; a collective whose send and receive buffers are neither identical nor disjoint needs
// a copy of one of them too.
func Overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

// Same reports whether a and b are the same bytes: same start, same length (an in-place
// operation, as opposed to one on buffers that merely overlap).
func Same(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// Copy is copy(dst, src) for large buffers, with up to workers goroutines.
func Copy(dst, src []byte, workers int) {
	n := min(len(dst), len(src))
	For(n, 1, 64, workers, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
}

// ForParts is For over parts laid back to back, lens[i] elements each: every range of the whole
// is handed over part by part, as f(i, lo, hi) for elements [lo, hi) of part i, in order on the
// range's goroutine. Many small parts (a step's gradients) thus share goroutines, a large one is
// split, and a goroutine's piece starts where the previous one ends whatever the parts' sizes.
// Empty parts are never handed over.
func ForParts(lens []int, elemBytes, align, workers int, f func(i, lo, hi int)) {
	n := 0
	for _, l := range lens {
		n += l
	}
	For(n, elemBytes, align, workers, func(lo, hi int) {
		i, start := 0, 0 // part i starts at element start of the whole
		for at := lo; at < hi; {
			for start+lens[i] <= at {
				start += lens[i]
				i++
			}
			end := min(hi, start+lens[i])
			f(i, at-start, end-start)
			at = end
		}
	})
}

// Gather copies parts back to back into dst, whose length is theirs together (a fusion buffer
// filled from many tensors), with up to workers goroutines, each taking one range of dst and
// the parts, or pieces of parts, that fall in it.
func Gather(dst []byte, parts [][]byte, workers int) { gather(dst, parts, workers, true) }

// Scatter copies src out, in order, into parts, whose length is src's together (a fusion
// buffer emptied into many tensors), with up to workers goroutines as Gather.
func Scatter(parts [][]byte, src []byte, workers int) { gather(src, parts, workers, false) }

// gather copies between buf and the parts laid back to back, into buf when in is set.
func gather(buf []byte, parts [][]byte, workers int, in bool) {
	lens, starts := make([]int, len(parts)), make([]int, len(parts))
	for i, p := range parts {
		lens[i] = len(p)
		if i > 0 {
			starts[i] = starts[i-1] + lens[i-1]
		}
	}
	ForParts(lens, 1, 64, workers, func(i, lo, hi int) {
		b := buf[starts[i]+lo : starts[i]+hi]
		if in {
			copy(b, parts[i][lo:hi])
		} else {
			copy(parts[i][lo:hi], b)
		}
	})
}
