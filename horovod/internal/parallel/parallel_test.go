package parallel

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// TestForCoversEachIndexOnce checks the ranges For hands out: disjoint, covering [0, n),
// aligned, and no more at once than asked for.
func TestForCoversEachIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 63, minPiece - 1, minPiece, 3*minPiece + 5, 8*minPiece + 1, 20 * minPiece} {
		for _, workers := range []int{1, 2, 3, 8} {
			var mu sync.Mutex
			var got [][2]int
			For(n, 1, 64, workers, func(lo, hi int) {
				mu.Lock()
				got = append(got, [2]int{lo, hi})
				mu.Unlock()
			})
			slices.SortFunc(got, func(a, b [2]int) int { return a[0] - b[0] })
			if len(got) > workers || len(got) > 1 && len(got) > n/minPiece {
				t.Errorf("n=%d workers=%d: %d ranges", n, workers, len(got))
			}
			next := 0
			for i, r := range got {
				if r[0] != next || r[1] < r[0] || (i < len(got)-1 && (r[1]-r[0])%64 != 0) {
					t.Fatalf("n=%d workers=%d: ranges %v", n, workers, got)
				}
				next = r[1]
			}
			if next != n {
				t.Fatalf("n=%d workers=%d: ranges %v end at %d", n, workers, got, next)
			}
		}
	}
}

// TestForPartsCoversEachElementOnce hands out parts of odd sizes (empty ones, many small ones,
// ones larger than a piece): every element of every part must be handed over exactly once, in
// non-empty pieces, and small parts must share ranges rather than get one each.
func TestForPartsCoversEachElementOnce(t *testing.T) {
	lens := []int{0, 7, minPiece + 3, 0, 1, 64*3 + 1}
	for range 300 {
		lens = append(lens, 5000+len(lens))
	}
	lens = append(lens, 2*minPiece-777, 0)
	for _, workers := range []int{1, 2, 3, 8} {
		var mu sync.Mutex
		seen := make([][]int, len(lens))
		for i, n := range lens {
			seen[i] = make([]int, n)
		}
		calls := 0
		ForParts(lens, 1, 64, workers, func(i, lo, hi int) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if lo >= hi {
				t.Errorf("workers=%d: part %d handed over empty [%d, %d)", workers, i, lo, hi)
			}
			for k := lo; k < hi; k++ {
				seen[i][k]++
			}
		})
		for i, s := range seen {
			for k, c := range s {
				if c != 1 {
					t.Fatalf("workers=%d: element %d of part %d handed over %d times", workers, k, i, c)
				}
			}
		}
		nonEmpty := 0
		for _, n := range lens {
			if n > 0 {
				nonEmpty++
			}
		}
		if calls > nonEmpty+workers-1 { // each range boundary splits at most one part in two
			t.Errorf("workers=%d: %d calls for %d non-empty parts", workers, calls, nonEmpty)
		}
	}
}

func TestCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 5, 4*minPiece + 77} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		for _, workers := range []int{1, 4} {
			dst := make([]byte, n+3) // longer than src: the tail stays as it was
			dst[n] = 0xAB
			Copy(dst, src, workers)
			if !bytes.Equal(dst[:n], src) || dst[n] != 0xAB {
				t.Fatalf("n=%d workers=%d: copy differs", n, workers)
			}
		}
	}
}

// TestGatherScatter copies parts of odd sizes (empty ones, ones shorter than a piece, ones across
// piece boundaries) into one buffer and back out with 1 to 8 goroutines: the buffer must hold
// their concatenation and the parts the buffer's bytes, nothing written past either.
func TestGatherScatter(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	sizes := []int{0, 1, minPiece + 3, 0, 64*3 + 1, 5, 2*minPiece - 777, 0}
	var parts [][]byte
	for _, n := range sizes {
		p := make([]byte, n, n+1) // a spare byte past each part: must stay untouched
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		p[:n+1][n] = 0xAB
		parts = append(parts, p)
	}
	want := bytes.Join(parts, nil)
	for _, workers := range []int{1, 2, 3, 8} {
		buf := make([]byte, len(want), len(want)+1)
		buf[:len(want)+1][len(want)] = 0xCD
		Gather(buf, parts, workers)
		if !bytes.Equal(buf, want) || buf[:len(want)+1][len(want)] != 0xCD {
			t.Fatalf("workers=%d: Gather differs from the concatenation", workers)
		}
		for i := range buf {
			buf[i] ^= 0x5A
		}
		outs := make([][]byte, len(sizes))
		for k, n := range sizes {
			outs[k] = make([]byte, n, n+1)
			outs[k][:n+1][n] = 0xAB
		}
		Scatter(outs, buf, workers)
		if !bytes.Equal(bytes.Join(outs, nil), buf) {
			t.Fatalf("workers=%d: Scatter's parts differ from the buffer", workers)
		}
		for k, o := range outs {
			if o[:len(o)+1][len(o)] != 0xAB {
				t.Fatalf("workers=%d: Scatter wrote past part %d", workers, k)
			}
		}
	}
}

func TestWorkers(t *testing.T) {
	for _, local := range []int{0, 1, 2, 1 << 20} {
		if w := Workers(local); w < 1 || w > MaxWorkers {
			t.Errorf("Workers(%d) = %d", local, w)
		}
	}
}

// BenchmarkCopy copies 128 MiB, the default fusion buffer, with 1 and MaxWorkers goroutines.
// The source is written first: untouched pages all map the kernel's one zero page, which stays
// in cache and would make the copy look several times faster than memory allows.
func BenchmarkCopy(b *testing.B) {
	src, dst := make([]byte, 128<<20), make([]byte, 128<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	copy(dst, src)
	for _, workers := range []int{1, MaxWorkers} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				Copy(dst, src, workers)
			}
		})
	}
}

func TestOverlapAndSame(t *testing.T) {
	buf := make([]byte, 100)
	other := make([]byte, 10)
	for _, c := range []struct {
		name          string
		a, b          []byte
		overlap, same bool
	}{
		{"identical", buf[10:20], buf[10:20], true, true},
		{"same start, longer", buf[10:20], buf[10:30], true, false},
		{"shifted", buf[10:20], buf[15:25], true, false},
		{"inside", buf[10:40], buf[20:30], true, false},
		{"adjacent", buf[10:20], buf[20:30], false, false},
		{"last byte shared", buf[10:21], buf[20:30], true, false},
		{"other allocation", buf, other, false, false},
		{"empty", buf[10:10], buf[5:15], false, false},
	} {
		if got := Overlap(c.a, c.b); got != c.overlap {
			t.Errorf("%s: Overlap = %v", c.name, got)
		}
		if got := Overlap(c.b, c.a); got != c.overlap {
			t.Errorf("%s: Overlap reversed = %v", c.name, got)
		}
		if got := Same(c.a, c.b); got != c.same {
			t.Errorf("%s: Same = %v", c.name, got)
		}
	}
}
