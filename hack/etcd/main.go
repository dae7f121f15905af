// Command etcd is upstream etcd (go.etcd.io/etcd/server/v3/etcdmain), built as
// its own module because etcd's dependency versions differ from Kubernetes'.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
