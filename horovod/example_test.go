package horovod_test

import (
	"fmt"
	"log"

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
