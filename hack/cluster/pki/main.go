// Command ftjob-pki writes the certificates and keys of the local test control plane, using
// only the Go standard library (so a fresh machine needs nothing but Go).
//
// Without -ca it writes the control plane's set into -dir (hack/cluster/up.sh):
//
//	ca.{crt,key}                        cluster CA (client-ca-file, root-ca-file, CSR signer)
//	apiserver.{crt,key}                 serving cert for 127.0.0.1, every -apiserver-ip (up.sh: the
//	                                    `kubernetes` Service's ClusterIP and the listen address),
//	                                    localhost, kubernetes.default.svc…
//	apiserver-kubelet-client.{crt,key}  the apiserver's client cert towards kubelets (logs, exec),
//	                                    group "system:masters"
//	admin.{crt,key}                     user "admin", group "system:masters"
//	kube-controller-manager.{crt,key}   user "system:kube-controller-manager" (built-in RBAC)
//	kube-scheduler.{crt,key}            user "system:kube-scheduler" (built-in RBAC)
//	sa.{key,pub}                        ServiceAccount token signing key pair (RSA 2048)
//
// With -ca DIR it signs with the CA in DIR and writes only the certificates named by -client and
// -serving into -dir (hack/cluster/node-up.sh: the kubelet's client and serving certs, kube-proxy,
// CoreDNS, the volume provisioner).
//
// Existing files are kept, so a restart reuses the same CA and keys, unless a certificate no
// longer matches what is asked for (subject, addresses, or not signed by the CA): then it is
// issued again, which is how a new -apiserver-ip reaches an existing cluster directory.
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"log"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

var (
	dir   = flag.String("dir", ".", "output directory")
	caDir = flag.String("ca", "", "directory holding ca.{crt,key}; when set, write only -client/-serving certs")
	apiIP listFlag
	// NAME=CN[,GROUP...]: a client certificate NAME.{crt,key} for user CN in the given groups.
	clients listFlag
	// NAME=CN,SAN...: a serving certificate; each SAN is an IP address or a DNS name.
	servings listFlag
)

func init() {
	flag.Var(&apiIP, "apiserver-ip", "extra IP address for the apiserver's serving cert (repeatable)")
	flag.Var(&clients, "client", "NAME=CN[,GROUP...]: issue a client cert (repeatable)")
	flag.Var(&servings, "serving", "NAME=CN,SAN...: issue a serving cert (repeatable)")
}

func exists(name string) bool { _, err := os.Stat(filepath.Join(*dir, name)); return err == nil }

func write(name, typ string, der []byte) {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(filepath.Join(*dir, name), b, 0o600); err != nil {
		log.Fatal(err)
	}
}

func read(name string) *pem.Block {
	b, err := os.ReadFile(filepath.Join(*dir, name))
	if err != nil {
		log.Fatal(err)
	}
	p, _ := pem.Decode(b)
	if p == nil {
		log.Fatalf("%s: no PEM block", name)
	}
	return p
}

func newKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	return k
}

func writeKey(name string, k crypto.Signer) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		log.Fatal(err)
	}
	write(name, "PRIVATE KEY", der)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		log.Fatal(err)
	}
	return n
}

func loadCA() (*x509.Certificate, crypto.Signer) {
	d := *dir
	if *caDir != "" {
		d = *caDir
	}
	b, err := os.ReadFile(filepath.Join(d, "ca.crt"))
	if err != nil {
		log.Fatal(err)
	}
	p, _ := pem.Decode(b)
	if p == nil {
		log.Fatalf("%s/ca.crt: no PEM block", d)
	}
	cert, err := x509.ParseCertificate(p.Bytes)
	if err != nil {
		log.Fatal(err)
	}
	if b, err = os.ReadFile(filepath.Join(d, "ca.key")); err != nil {
		log.Fatal(err)
	}
	if p, _ = pem.Decode(b); p == nil {
		log.Fatalf("%s/ca.key: no PEM block", d)
	}
	k, err := x509.ParsePKCS8PrivateKey(p.Bytes)
	if err != nil {
		log.Fatal(err)
	}
	return cert, k.(crypto.Signer)
}

// current reports whether NAME.crt exists, is signed by ca and has the subject and addresses of tmpl.
func current(name string, tmpl *x509.Certificate, ca *x509.Certificate) bool {
	if !exists(name + ".crt") {
		return false
	}
	c, err := x509.ParseCertificate(read(name + ".crt").Bytes)
	if err != nil || c.CheckSignatureFrom(ca) != nil {
		return false
	}
	ipEq := func(a, b net.IP) bool { return a.Equal(b) }
	return c.Subject.CommonName == tmpl.Subject.CommonName &&
		slices.Equal(c.Subject.Organization, tmpl.Subject.Organization) &&
		slices.Equal(c.DNSNames, tmpl.DNSNames) &&
		slices.EqualFunc(c.IPAddresses, tmpl.IPAddresses, ipEq)
}

func issue(name string, tmpl *x509.Certificate) {
	ca, caKey := loadCA()
	if current(name, tmpl, ca) {
		return
	}
	k := newKey()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().AddDate(10, 0, 0)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		log.Fatal(err)
	}
	writeKey(name+".key", k)
	write(name+".crt", "CERTIFICATE", der)
}

func client(name, user string, groups ...string) {
	issue(name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func serving(name, cn string, sans ...string) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, s := range sans {
		if slices.Contains(tmpl.DNSNames, s) || slices.ContainsFunc(tmpl.IPAddresses, net.ParseIP(s).Equal) {
			continue // asked twice, e.g. -apiserver-ip 127.0.0.1
		}
		if ip := net.ParseIP(s); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, s)
		}
	}
	issue(name, tmpl)
}

// requested issues the certificates named by -client and -serving.
func requested() {
	for _, spec := range clients {
		name, rest, ok := strings.Cut(spec, "=")
		if !ok || rest == "" {
			log.Fatalf("-client %q: want NAME=CN[,GROUP...]", spec)
		}
		f := strings.Split(rest, ",")
		client(name, f[0], f[1:]...)
	}
	for _, spec := range servings {
		name, rest, ok := strings.Cut(spec, "=")
		f := strings.Split(rest, ",")
		if !ok || len(f) < 2 {
			log.Fatalf("-serving %q: want NAME=CN,SAN...", spec)
		}
		serving(name, f[0], f[1:]...)
	}
}

func main() {
	flag.Parse()
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		log.Fatal(err)
	}
	if *caDir != "" {
		requested()
		return
	}
	if !exists("ca.crt") {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber:          serial(),
			Subject:               pkix.Name{CommonName: "finetune-operator-test-ca"},
			NotBefore:             time.Now().Add(-time.Hour),
			NotAfter:              time.Now().AddDate(10, 0, 0),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			log.Fatal(err)
		}
		writeKey("ca.key", k)
		write("ca.crt", "CERTIFICATE", der)
	}
	serving("apiserver", "kube-apiserver", append([]string{"127.0.0.1"}, append(apiIP,
		"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local")...)...)
	client("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
	client("admin", "admin", "system:masters")
	client("kube-controller-manager", "system:kube-controller-manager")
	client("kube-scheduler", "system:kube-scheduler")
	if !exists("sa.key") {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			log.Fatal(err)
		}
		writeKey("sa.key", k)
		pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err != nil {
			log.Fatal(err)
		}
		write("sa.pub", "PUBLIC KEY", pub)
	}
	requested()
}
