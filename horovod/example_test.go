package horovod_test

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/gorovod/gorovod/horovod"
)

// A process set runs collectives among some of the job's ranks. Every rank adds it; started by
// hand this is a job of one process, whose set of rank 0 is the whole job; under mpirun -np 4,
// AddProcessSet([]int{0, 2}) gives ranks 0 and 2 a set of size 2 and the others nil.
func ExampleHorovod_AddProcessSet() {
	hvd, err := horovod.Init(horovod.WithDynamicProcessSets()) // or HOROVOD_DYNAMIC_PROCESS_SETS=1
	if err != nil {
		log.Fatal(err)
	}
	defer hvd.Shutdown()
	set, err := hvd.AddProcessSet([]int{0})
	if err != nil {
		log.Fatal(err)
	}
	if set == nil {
		return // this rank is not in the set
	}
	t, _ := horovod.NewTensor([]int{2}, []float32{1, 2})
	sum, err := set.Allreduce("x", t, horovod.AllreduceOptions{Op: horovod.Sum})
	if err != nil {
		log.Fatal(err)
	}
	v, _ := horovod.Values[float32](sum)
	fmt.Println(set.Rank(), set.Size(), set.ProcessSetRanks(), v)
	// Output: 0 1 [0] [1 2]
}

// Process sets fixed at Init (Horovod's hvd.init(process_sets=[...])): Init adds them before it
// returns, and ProcessSets holds them in order, nil for a set this rank is not in. Started by
// hand this is a job of one process; under mpirun -np 4, ProcessSets()[0] is a set on ranks 0
// and 2 and nil on ranks 1 and 3.
func ExampleWithProcessSets() {
	hvd, err := horovod.Init(horovod.WithProcessSets([]int{0}))
	if err != nil {
		log.Fatal(err)
	}
	defer hvd.Shutdown()
	for _, set := range hvd.ProcessSets() {
		if set != nil {
			fmt.Println(set.ProcessSetRanks(), set.Rank(), set.Size())
		}
	}
	// Output: [0] 0 1
}

// Adasum combines gradients instead of averaging them: where the ranks' gradients agree it
// gives their common direction at the length of one (here, in a job of one process, the
// gradient itself); where they are orthogonal, their sum.
func ExampleAdasum() {
	hvd, err := horovod.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer hvd.Shutdown()
	g, _ := horovod.NewTensor(nil, []float32{0.5, -1})
	out, err := hvd.Allreduce("grad", g, horovod.AllreduceOptions{Op: horovod.Adasum})
	if err != nil {
		log.Fatal(err)
	}
	v, _ := horovod.Values[float32](out)
	fmt.Println(v)
	// Output: [0.5 -1]
}

// A timeline of a few steps only (Horovod's hvd.start_timeline): every rank calls StartTimeline
// and StopTimeline at the same steps, and the job's rank 0 writes the file. Here steps 5 and 6 of
// 10, so the file holds two allreduces.
func ExampleHorovod_StartTimeline() {
	hvd, err := horovod.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer hvd.Shutdown()
	dir, err := os.MkdirTemp("", "timeline")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "steps.json")
	grad, _ := horovod.NewTensor([]int{2}, []float32{1, 2})
	for step := range 10 {
		switch step {
		case 5:
			err = hvd.StartTimeline(path)
		case 7:
			err = hvd.StopTimeline()
		}
		if err != nil {
			log.Fatal(err)
		}
		if _, err := hvd.Allreduce("grad", grad, horovod.AllreduceOptions{}); err != nil {
			log.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	var events []struct{ Name, Ph string }
	if err := json.Unmarshal(raw, &events); err != nil {
		log.Fatal(err)
	}
	allreduces := 0
	for _, e := range events {
		if e.Ph == "B" && e.Name == "ALLREDUCE" {
			allreduces++
		}
	}
	fmt.Println(allreduces)
	// Output: 2
}
