package tokenizer

import (
	"os"
	"strconv"
	"testing"
)

// BenchmarkEncodeIMDB tokenizes IMDB reviews on one goroutine; MB/s is over the review bytes.
// GOROVOD_BENCH_REVIEWS sets how many reviews of train.tsv (default 5000);
// bertgraph/datatests/bench_tokenizer.py runs it beside HF tokenizers on the same texts.
func BenchmarkEncodeIMDB(b *testing.B) {
	n := 5000
	if s := os.Getenv("GOROVOD_BENCH_REVIEWS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	texts := imdbTexts(b, "train", n)
	tok, _ := miniLM(b, Options{DoLowerCase: true})
	size := 0
	for _, s := range texts {
		size += len(s)
	}
	b.SetBytes(int64(size))
	var ids []int32
	tokens := 0
	b.ResetTimer()
	for b.Loop() {
		tokens = 0
		for _, s := range texts {
			ids = tok.AppendIDs(ids[:0], s)
			tokens += len(ids)
		}
	}
	b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
