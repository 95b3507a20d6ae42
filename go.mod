module github.com/gorovod/gorovod

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/x448/float16 v0.8.4
	golang.org/x/sys v0.50.0
	golang.org/x/term v0.48.0
	golang.org/x/text v0.44.0
	google.golang.org/protobuf v1.36.12
)
