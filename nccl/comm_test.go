package nccl

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestTypesMatchNCCLHeader(t *testing.T) {
	// Values from nccl.h (ncclDataType_t, ncclRedOp_t, ncclResult_t): a wrong one here would
	// reduce the wrong type on a GPU, so they are pinned one by one.
	for dt, want := range map[DataType]int{Int8: 0, Uint8: 1, Int32: 2, Uint32: 3, Int64: 4, Uint64: 5, Float16: 6, Float32: 7, Float64: 8, Bfloat16: 9} {
		if int(dt) != want {
			t.Errorf("%v = %d, want %d", dt, int(dt), want)
		}
	}
	for op, want := range map[RedOp]int{Sum: 0, Prod: 1, Max: 2, Min: 3, Avg: 4} {
		if int(op) != want {
			t.Errorf("%v = %d, want %d", op, int(op), want)
		}
	}
	sizes := map[DataType]int{Int8: 1, Uint8: 1, Int32: 4, Uint32: 4, Int64: 8, Uint64: 8, Float16: 2, Float32: 4, Float64: 8, Bfloat16: 2}
	for dt, want := range sizes {
		if dt.Size() != want {
			t.Errorf("%v.Size() = %d, want %d", dt, dt.Size(), want)
		}
	}
	if DataType(12).Size() != 0 || DataType(12).String() != "DataType(12)" || Float16.String() != "float16" {
		t.Error("unknown data type not reported")
	}
	if Avg.String() != "avg" || RedOp(9).String() != "RedOp(9)" {
		t.Error("RedOp names")
	}
	if Timeout.String() != "ncclTimeout" || Result(42).String() != "ncclResult(42)" || int(RemoteError) != 6 {
		t.Error("Result names")
	}
}

func TestLibraryVersionAndUniqueID(t *testing.T) {
	lib := fakeNCCL(t, "1")
	if lib.Version() != 23203 || lib.VersionString() != "2.32.3" {
		t.Errorf("version %d %s", lib.Version(), lib.VersionString())
	}
	t.Setenv("FAKE_NCCL_VERSION", "2708") // codes before 2.9 were major*1000+minor*100+patch
	old, err := Load(lib.Runtime(), Options{LibraryPath: fakeLib(t, "nccl")})
	if err != nil {
		t.Fatal(err)
	}
	if old.VersionString() != "2.7.8" {
		t.Errorf("old version string %s", old.VersionString())
	}
	id, err := lib.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range id {
		if b != byte(i*7+3) {
			t.Fatalf("id[%d] = %d: the 128 bytes did not come back intact", i, b)
		}
	}
	if err := lib.GroupStart(); err != nil {
		t.Fatal(err)
	}
	if err := lib.GroupEnd(); err != nil {
		t.Fatal(err)
	}
	var ne *NCCLError
	t.Setenv("FAKE_FAIL", "ncclGetUniqueId:2,ncclGroupStart:5,ncclGroupEnd:5")
	if _, err := lib.GetUniqueID(); !errors.As(err, &ne) || ne.Op != "ncclGetUniqueId" || ne.Code != SystemError {
		t.Errorf("GetUniqueID: %v", err)
	}
	if err := lib.GroupStart(); !errors.As(err, &ne) || ne.Op != "ncclGroupStart" {
		t.Errorf("GroupStart: %v", err)
	}
	if err := lib.GroupEnd(); !errors.As(err, &ne) || ne.Op != "ncclGroupEnd" {
		t.Errorf("GroupEnd: %v", err)
	}
	t.Setenv("FAKE_FAIL", "ncclGetVersion:3")
	if _, err := Load(lib.Runtime(), Options{LibraryPath: fakeLib(t, "nccl")}); !errors.As(err, &ne) || ne.Code != InternalError {
		t.Errorf("Load with failing ncclGetVersion: %v", err)
	}
}

func newFakeComm(t *testing.T, lib *Library) *Comm {
	t.Helper()
	id, err := lib.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := lib.NewComm(newStream(t, lib, 0), 2, 1, id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newStream is a stream on device dev that the test closes at its end (a second Close, after
// a Comm's, does nothing).
func newStream(t *testing.T, lib *Library, dev int) *Stream {
	t.Helper()
	s, err := lib.Runtime().NewStream(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestNewCommErrors(t *testing.T) {
	lib := fakeNCCL(t, "1")
	id, _ := lib.GetUniqueID()
	s := newStream(t, lib, 0)
	for _, rs := range [][2]int{{0, 0}, {-1, 2}, {2, 2}} {
		if _, err := lib.NewComm(s, rs[1], rs[0], id); err == nil || !strings.Contains(err.Error(), "want 0 <= rank < size") {
			t.Errorf("rank %d size %d: %v", rs[0], rs[1], err)
		}
	}
	closed := newStream(t, lib, 0)
	closed.Close()
	if _, err := lib.NewComm(closed, 1, 0, id); err == nil || !strings.Contains(err.Error(), "closed stream") {
		t.Errorf("a closed stream: %v", err)
	}
	// The fake accepts only the id it made: the 128-byte struct must cross the call by value.
	var ne *NCCLError
	if _, err := lib.NewComm(s, 1, 0, UniqueID{}); !errors.As(err, &ne) || ne.Code != InvalidArgument {
		t.Errorf("foreign id: %v", err)
	}
	t.Setenv("FAKE_FAIL", "ncclCommInitRank:2")
	_, err := lib.NewComm(s, 4, 3, id)
	if !errors.As(err, &ne) || ne.Code != SystemError || ne.Op != "ncclCommInitRank(rank 3 of 4) on device 0" ||
		ne.Message != "fake: other error" || ne.Detail != "fake detail" {
		t.Fatalf("init failure: %#v", err)
	}
	if !strings.Contains(err.Error(), "ncclSystemError (2)") {
		t.Errorf("message %q", err.Error())
	}
}

func TestCollectiveArgumentChecks(t *testing.T) {
	lib := fakeNCCL(t, "2")
	c := newFakeComm(t, lib)
	if c.Device() != 0 || c.Size() != 2 || c.Rank() != 1 || c.Stream().Device() != 0 {
		t.Fatal("comm description")
	}
	buf, err := lib.Runtime().AllocDevice(0, 64)
	if err != nil {
		t.Fatal(err)
	}
	small, _ := lib.Runtime().AllocDevice(0, 8)
	elsewhere, _ := lib.Runtime().AllocDevice(1, 64)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"too many elements", c.AllReduce(buf, 17, Float32, Sum), "17 float32 elements (68 bytes) at offset 0 do not fit in a 64-byte buffer"},
		{"chunk past the end", c.AllReduceAt(buf, 32, 9, Float32, Sum), "9 float32 elements (36 bytes) at offset 32 do not fit"},
		{"misaligned chunk", c.AllReduceAt(buf, 2, 1, Float32, Sum), "offset 2 is not a float32 element boundary"},
		{"chunk beyond buffer", c.AllReduceAt(buf, 68, 0, Float16, Sum), "offset 68 is not a float16 element boundary within the 64-byte buffer"},
		{"negative offset", c.AllReduceAt(buf, -4, 1, Float32, Sum), "offset -4"},
		{"negative count", c.AllReduce(buf, -1, Float16, Sum), "-1 float16 elements"},
		{"unknown type", c.AllReduce(buf, 1, DataType(40), Sum), "unknown data type DataType(40)"},
		{"unknown op", c.AllReduce(buf, 1, Float32, RedOp(7)), "unknown reduction RedOp(7)"},
		{"other device", c.AllReduce(elsewhere, 1, Float32, Sum), "buffer is on device 1, communicator on device 0"},
		{"nil buffer", c.Broadcast(nil, 1, Float32, 0), "nil or closed device buffer"},
		{"root out of range", c.Broadcast(buf, 1, Float32, 2), "root 2, want 0 <= root < size 2"},
		{"negative root", c.Broadcast(buf, 1, Float32, -1), "root -1"},
		{"gather receive too small", c.AllGather(buf, small, 2, Float32), "AllGather receive: 4 float32 elements (16 bytes) at offset 0 do not fit in a 8-byte buffer"},
		{"gather send too big", c.AllGather(small, buf, 4, Float32), "AllGather send: 4 float32"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, tc.err, tc.want)
		}
	}
	// Well-formed calls reach the library; the fake is told to answer ncclInvalidUsage, and the error
	// names the call and carries ncclGetLastError's detail for this communicator.
	var ne *NCCLError
	t.Setenv("FAKE_FAIL", "ncclAllReduce:5,ncclBroadcast:5,ncclAllGather:5")
	for _, tc := range []struct {
		err error
		op  string
	}{
		{c.AllReduce(buf, 16, Float32, Avg), "ncclAllReduce(16 float32, avg) on rank 1"},
		{c.AllReduce(buf, 32, Float16, Max), "ncclAllReduce(32 float16, max) on rank 1"},
		{c.AllReduceAt(buf, 48, 8, Float16, Min), "ncclAllReduce(8 float16, min) on rank 1"},
		{c.Broadcast(buf, 8, Float64, 1), "ncclBroadcast(8 float64, root 1) on rank 1"},
		{c.AllGather(small, buf, 2, Float32), "ncclAllGather(2 float32 per rank) on rank 1"},
	} {
		if !errors.As(tc.err, &ne) || ne.Code != InvalidUsage || ne.Op != tc.op || ne.Detail != "fake detail for the comm" {
			t.Errorf("err = %#v, want ncclInvalidUsage from %q", tc.err, tc.op)
		}
	}
	t.Setenv("FAKE_FAIL", "")
	if err := c.AllReduce(buf, 0, Float32, Sum); err != nil {
		t.Errorf("accepted call: %v", err)
	}
	if err := c.AsyncError(); err != nil {
		t.Errorf("AsyncError = %v", err)
	}
	t.Setenv("FAKE_NCCL_ASYNC_ERR", "6")
	if err := c.AsyncError(); !errors.As(err, &ne) || ne.Code != RemoteError || ne.Op != "asynchronous NCCL error on rank 1" {
		t.Errorf("AsyncError = %v, want ncclRemoteError", err)
	}
	t.Setenv("FAKE_FAIL", "ncclCommGetAsyncError:4")
	if err := c.AsyncError(); !errors.As(err, &ne) || ne.Op != "ncclCommGetAsyncError" {
		t.Errorf("failing ncclCommGetAsyncError: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduce(buf, 1, Float32, Sum); err == nil || !strings.Contains(err.Error(), "closed communicator") {
		t.Errorf("after Close: %v", err)
	}
	if err := c.AsyncError(); err == nil {
		t.Error("AsyncError after Close succeeded")
	}
	if err := newFakeComm(t, lib).Abort(); err != nil {
		t.Errorf("Abort: %v", err)
	}
}

func TestAverageAndBfloat16NeedNCCL210(t *testing.T) {
	t.Setenv("FAKE_NCCL_VERSION", "2906")
	lib := fakeNCCL(t, "1")
	c := newFakeComm(t, lib)
	defer c.Close()
	buf, _ := lib.Runtime().AllocDevice(0, 16)
	if err := c.AllReduce(buf, 4, Float32, Avg); err == nil || !strings.Contains(err.Error(), "average needs NCCL >= 2.10, loaded 2.9.6") {
		t.Errorf("err = %v", err)
	}
	if err := c.AllReduce(buf, 4, Bfloat16, Sum); err == nil || !strings.Contains(err.Error(), "bfloat16 needs NCCL >= 2.10, loaded 2.9.6") {
		t.Errorf("bfloat16: err = %v", err)
	}
}

// A group spans whatever the goroutine does between GroupStart and GroupEnd: blocked meanwhile
// (here on other goroutines' work, as staging between a group's collectives would be), it comes
// back on the thread that opened the group, where the fake library, like NCCL, keeps it; on
// another thread GroupEnd would be ncclInvalidUsage. A goroutine free to move changed threads in
// about 1% of such rounds (GOMAXPROCS 2-4): 1,000 rounds make the unlocked case all but certain
// to fail.
func TestGroupStaysOnItsThread(t *testing.T) {
	lib := fakeNCCL(t, "1")
	defer runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0)))
	runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0)))
	for round := range 1000 {
		if err := lib.GroupStart(); err != nil {
			t.Fatal(err)
		}
		tid := syscall.Gettid()
		var work sync.WaitGroup
		for range 4 {
			work.Go(func() { time.Sleep(20 * time.Microsecond) })
		}
		work.Wait()
		if moved := syscall.Gettid() != tid; moved {
			t.Errorf("round %d: the goroutine changed threads inside a group", round)
		}
		if err := lib.GroupEnd(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}
