package horovod

import "github.com/gorovod/gorovod/horovod/internal/parallel"

// scaleBlock is how many bytes a fusion buffer pass copies and then scales (or scales and then
// copies) while they are in the second-level cache: one pass over memory instead of two.
const scaleBlock = 64 << 10

// gather copies parts back to back into buf (whose length is theirs together) and
// multiplies the result by f: the fusion buffer's MEMCPY_IN with the prescale. Large buffers
// are split over up to workers goroutines, each taking one range of buf and the parts, or
// pieces of parts, that fall in it; the result does not depend on workers.
func gather(buf []byte, parts [][]byte, dt DType, f float64, workers int) {
	fusionPass(buf, parts, dt, f, workers, true)
}

// scatter multiplies buf by f and copies it out, in order, into parts (whose length is
// buf's together): the postscale and the fusion buffer's MEMCPY_OUT. It splits the work as
// gather does; buf is left scaled.
func scatter(parts [][]byte, buf []byte, dt DType, f float64, workers int) {
	fusionPass(buf, parts, dt, f, workers, false)
}

func fusionPass(buf []byte, parts [][]byte, dt DType, f float64, workers int, in bool) {
	size := dt.Size()
	parallel.For(len(buf)/size, size, passAlign, workers, func(lo, hi int) {
		lo, hi = lo*size, hi*size
		block := hi - lo // unscaled: one copy per part, as large as it can be
		if f != 1 {
			block = scaleBlock
		}
		i, start := 0, 0 // parts[i] is where buf[start:] begins
		for b := lo; b < hi; b += block {
			e := min(b+block, hi)
			if !in {
				scaleRange(buf[b:e], dt, f)
			}
			for at := b; at < e; {
				for start+len(parts[i]) <= at {
					start += len(parts[i])
					i++
				}
				p := parts[i][at-start:]
				var n int
				if in {
					n = copy(buf[at:e], p)
				} else {
					n = copy(p, buf[at:e])
				}
				at += n
			}
			if in {
				scaleRange(buf[b:e], dt, f)
			}
		}
	})
}
