package features

import (
	"fmt"
	"io"
	"runtime"
	"sync"
)

// Source yields examples in order, io.EOF after the last; *Reader is one.
type Source interface {
	Next() (InputExample, error)
}

// SliceSource yields examples from memory.
type SliceSource struct {
	Examples []InputExample
	next     int
}

// Next returns the next example or io.EOF.
func (s *SliceSource) Next() (InputExample, error) {
	if s.next == len(s.Examples) {
		return InputExample{}, io.EOF
	}
	s.next++
	return s.Examples[s.next-1], nil
}

// StreamOptions configure Stream.
type StreamOptions struct {
	BatchSize int
	// Workers converting batches in parallel; 0 means GOMAXPROCS.
	Workers int
	// DropRemainder drops a final partial batch (training, as run_classifier's train input_fn);
	// otherwise it is a batch of its own examples only (eval and predict; run_classifier pads it
	// on TPUs only): its cost follows the examples left, not BatchSize.
	DropRemainder bool
}

// Stream converts a Source into batches on several goroutines and yields them in source order.
// It reads ahead a bounded number of batches (a few per worker), so memory does not grow with the
// input.
type Stream struct {
	futures chan chan batchResult
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	err     error
}

type batchResult struct {
	batch *Batch
	err   error
}

type batchJob struct {
	examples []InputExample
	result   chan batchResult
}

// Stream starts converting src. The caller must Close the stream; src is read only by the
// stream's own goroutine until Next has returned io.EOF or an error, or Close has returned.
func (c *Converter) Stream(src Source, opts StreamOptions) *Stream {
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	s := &Stream{futures: make(chan chan batchResult, 2*workers), done: make(chan struct{})}
	if opts.BatchSize <= 0 {
		s.err = fmt.Errorf("features: batch size %d is not positive", opts.BatchSize)
		close(s.futures)
		return s
	}
	jobs := make(chan batchJob, workers)
	for range workers {
		s.wg.Go(func() {
			for j := range jobs {
				b, err := c.ConvertBatch(j.examples, len(j.examples))
				j.result <- batchResult{b, err}
			}
		})
	}
	s.wg.Go(func() {
		defer close(s.futures)
		defer close(jobs)
		for {
			// Grown as examples come: a batch size far beyond the data (a whole eval set in
			// one batch) costs what the examples do, not what the flag says.
			examples := make([]InputExample, 0, min(opts.BatchSize, 1024))
			var srcErr error
			for len(examples) < opts.BatchSize {
				ex, err := src.Next()
				if err != nil {
					srcErr = err
					break
				}
				examples = append(examples, ex)
			}
			last := srcErr != nil
			// A partial batch is the last one: kept at its size, or dropped with DropRemainder;
			// after a source error it is dropped and the error follows the batches before it.
			partial := len(examples) < opts.BatchSize
			if len(examples) > 0 && !(partial && (opts.DropRemainder || srcErr != io.EOF)) {
				res := make(chan batchResult, 1)
				select {
				case jobs <- batchJob{examples, res}:
				case <-s.done:
					return
				}
				select {
				case s.futures <- res:
				case <-s.done:
					return
				}
			}
			if last {
				if srcErr != io.EOF {
					res := make(chan batchResult, 1)
					res <- batchResult{err: srcErr}
					select {
					case s.futures <- res:
					case <-s.done:
					}
				}
				return
			}
		}
	})
	return s
}

// Next returns the next batch, io.EOF after the last, or the first error of reading or
// converting (after which the stream is finished).
func (s *Stream) Next() (*Batch, error) {
	if s.err != nil {
		return nil, s.err
	}
	res, ok := <-s.futures
	if !ok {
		s.err = io.EOF
		return nil, s.err
	}
	r := <-res
	if r.err != nil {
		s.err = r.err
		s.Close()
		return nil, r.err
	}
	return r.batch, nil
}

// Close stops the stream's goroutines and waits for them.
func (s *Stream) Close() {
	s.once.Do(func() {
		close(s.done)
		s.wg.Wait()
	})
}
