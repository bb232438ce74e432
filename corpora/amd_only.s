# AMD-only and vendor-specific encodings (FMA4, XOP, TBM, SSE4a, 3DNow!, SVM, and newer AMD system
# instructions), written for this project and assembled by llvm-mc in tests/test_decoder.py, which checks
# that capstone and iced-x86 are reconciled on them (x86.decoders.known_bugs): the soundness-by-class
# issue's target is under 0.5% rejected as 'decoders disagree'.
vfmaddps %xmm1, %xmm2, %xmm3, %xmm0
vfmaddps %xmm9, %xmm10, %xmm11, %xmm8
vfmaddps %xmm15, %xmm2, %xmm3, %xmm4
vfmaddps (%rax), %xmm2, %xmm3, %xmm4
vfmaddps %xmm1, (%rax), %xmm3, %xmm4
vfmaddps 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmaddps %ymm1, %ymm2, %ymm3, %ymm0
vfmaddps %ymm9, %ymm10, %ymm11, %ymm8
vfmaddps %ymm15, %ymm2, %ymm3, %ymm4
vfmaddps (%rax), %ymm2, %ymm3, %ymm4
vfmaddps %ymm1, (%rax), %ymm3, %ymm4
vfmaddps 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmaddpd %xmm1, %xmm2, %xmm3, %xmm0
vfmaddpd %xmm9, %xmm10, %xmm11, %xmm8
vfmaddpd %xmm15, %xmm2, %xmm3, %xmm4
vfmaddpd (%rax), %xmm2, %xmm3, %xmm4
vfmaddpd %xmm1, (%rax), %xmm3, %xmm4
vfmaddpd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmaddpd %ymm1, %ymm2, %ymm3, %ymm0
vfmaddpd %ymm9, %ymm10, %ymm11, %ymm8
vfmaddpd %ymm15, %ymm2, %ymm3, %ymm4
vfmaddpd (%rax), %ymm2, %ymm3, %ymm4
vfmaddpd %ymm1, (%rax), %ymm3, %ymm4
vfmaddpd 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmaddss %xmm1, %xmm2, %xmm3, %xmm0
vfmaddss %xmm9, %xmm10, %xmm11, %xmm8
vfmaddss %xmm15, %xmm2, %xmm3, %xmm4
vfmaddss (%rax), %xmm2, %xmm3, %xmm4
vfmaddss %xmm1, (%rax), %xmm3, %xmm4
vfmaddss 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmaddsd %xmm1, %xmm2, %xmm3, %xmm0
vfmaddsd %xmm9, %xmm10, %xmm11, %xmm8
vfmaddsd %xmm15, %xmm2, %xmm3, %xmm4
vfmaddsd (%rax), %xmm2, %xmm3, %xmm4
vfmaddsd %xmm1, (%rax), %xmm3, %xmm4
vfmaddsd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmsubps %xmm1, %xmm2, %xmm3, %xmm0
vfmsubps %xmm9, %xmm10, %xmm11, %xmm8
vfmsubps %xmm15, %xmm2, %xmm3, %xmm4
vfmsubps (%rax), %xmm2, %xmm3, %xmm4
vfmsubps %xmm1, (%rax), %xmm3, %xmm4
vfmsubps 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmsubps %ymm1, %ymm2, %ymm3, %ymm0
vfmsubps %ymm9, %ymm10, %ymm11, %ymm8
vfmsubps %ymm15, %ymm2, %ymm3, %ymm4
vfmsubps (%rax), %ymm2, %ymm3, %ymm4
vfmsubps %ymm1, (%rax), %ymm3, %ymm4
vfmsubps 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmsubpd %xmm1, %xmm2, %xmm3, %xmm0
vfmsubpd %xmm9, %xmm10, %xmm11, %xmm8
vfmsubpd %xmm15, %xmm2, %xmm3, %xmm4
vfmsubpd (%rax), %xmm2, %xmm3, %xmm4
vfmsubpd %xmm1, (%rax), %xmm3, %xmm4
vfmsubpd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmsubpd %ymm1, %ymm2, %ymm3, %ymm0
vfmsubpd %ymm9, %ymm10, %ymm11, %ymm8
vfmsubpd %ymm15, %ymm2, %ymm3, %ymm4
vfmsubpd (%rax), %ymm2, %ymm3, %ymm4
vfmsubpd %ymm1, (%rax), %ymm3, %ymm4
vfmsubpd 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmsubss %xmm1, %xmm2, %xmm3, %xmm0
vfmsubss %xmm9, %xmm10, %xmm11, %xmm8
vfmsubss %xmm15, %xmm2, %xmm3, %xmm4
vfmsubss (%rax), %xmm2, %xmm3, %xmm4
vfmsubss %xmm1, (%rax), %xmm3, %xmm4
vfmsubss 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmsubsd %xmm1, %xmm2, %xmm3, %xmm0
vfmsubsd %xmm9, %xmm10, %xmm11, %xmm8
vfmsubsd %xmm15, %xmm2, %xmm3, %xmm4
vfmsubsd (%rax), %xmm2, %xmm3, %xmm4
vfmsubsd %xmm1, (%rax), %xmm3, %xmm4
vfmsubsd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmaddps %xmm1, %xmm2, %xmm3, %xmm0
vfnmaddps %xmm9, %xmm10, %xmm11, %xmm8
vfnmaddps %xmm15, %xmm2, %xmm3, %xmm4
vfnmaddps (%rax), %xmm2, %xmm3, %xmm4
vfnmaddps %xmm1, (%rax), %xmm3, %xmm4
vfnmaddps 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmaddps %ymm1, %ymm2, %ymm3, %ymm0
vfnmaddps %ymm9, %ymm10, %ymm11, %ymm8
vfnmaddps %ymm15, %ymm2, %ymm3, %ymm4
vfnmaddps (%rax), %ymm2, %ymm3, %ymm4
vfnmaddps %ymm1, (%rax), %ymm3, %ymm4
vfnmaddps 0x10(%rip), %ymm2, %ymm3, %ymm4
vfnmaddpd %xmm1, %xmm2, %xmm3, %xmm0
vfnmaddpd %xmm9, %xmm10, %xmm11, %xmm8
vfnmaddpd %xmm15, %xmm2, %xmm3, %xmm4
vfnmaddpd (%rax), %xmm2, %xmm3, %xmm4
vfnmaddpd %xmm1, (%rax), %xmm3, %xmm4
vfnmaddpd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmaddpd %ymm1, %ymm2, %ymm3, %ymm0
vfnmaddpd %ymm9, %ymm10, %ymm11, %ymm8
vfnmaddpd %ymm15, %ymm2, %ymm3, %ymm4
vfnmaddpd (%rax), %ymm2, %ymm3, %ymm4
vfnmaddpd %ymm1, (%rax), %ymm3, %ymm4
vfnmaddpd 0x10(%rip), %ymm2, %ymm3, %ymm4
vfnmaddss %xmm1, %xmm2, %xmm3, %xmm0
vfnmaddss %xmm9, %xmm10, %xmm11, %xmm8
vfnmaddss %xmm15, %xmm2, %xmm3, %xmm4
vfnmaddss (%rax), %xmm2, %xmm3, %xmm4
vfnmaddss %xmm1, (%rax), %xmm3, %xmm4
vfnmaddss 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmaddsd %xmm1, %xmm2, %xmm3, %xmm0
vfnmaddsd %xmm9, %xmm10, %xmm11, %xmm8
vfnmaddsd %xmm15, %xmm2, %xmm3, %xmm4
vfnmaddsd (%rax), %xmm2, %xmm3, %xmm4
vfnmaddsd %xmm1, (%rax), %xmm3, %xmm4
vfnmaddsd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmsubps %xmm1, %xmm2, %xmm3, %xmm0
vfnmsubps %xmm9, %xmm10, %xmm11, %xmm8
vfnmsubps %xmm15, %xmm2, %xmm3, %xmm4
vfnmsubps (%rax), %xmm2, %xmm3, %xmm4
vfnmsubps %xmm1, (%rax), %xmm3, %xmm4
vfnmsubps 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmsubps %ymm1, %ymm2, %ymm3, %ymm0
vfnmsubps %ymm9, %ymm10, %ymm11, %ymm8
vfnmsubps %ymm15, %ymm2, %ymm3, %ymm4
vfnmsubps (%rax), %ymm2, %ymm3, %ymm4
vfnmsubps %ymm1, (%rax), %ymm3, %ymm4
vfnmsubps 0x10(%rip), %ymm2, %ymm3, %ymm4
vfnmsubpd %xmm1, %xmm2, %xmm3, %xmm0
vfnmsubpd %xmm9, %xmm10, %xmm11, %xmm8
vfnmsubpd %xmm15, %xmm2, %xmm3, %xmm4
vfnmsubpd (%rax), %xmm2, %xmm3, %xmm4
vfnmsubpd %xmm1, (%rax), %xmm3, %xmm4
vfnmsubpd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmsubpd %ymm1, %ymm2, %ymm3, %ymm0
vfnmsubpd %ymm9, %ymm10, %ymm11, %ymm8
vfnmsubpd %ymm15, %ymm2, %ymm3, %ymm4
vfnmsubpd (%rax), %ymm2, %ymm3, %ymm4
vfnmsubpd %ymm1, (%rax), %ymm3, %ymm4
vfnmsubpd 0x10(%rip), %ymm2, %ymm3, %ymm4
vfnmsubss %xmm1, %xmm2, %xmm3, %xmm0
vfnmsubss %xmm9, %xmm10, %xmm11, %xmm8
vfnmsubss %xmm15, %xmm2, %xmm3, %xmm4
vfnmsubss (%rax), %xmm2, %xmm3, %xmm4
vfnmsubss %xmm1, (%rax), %xmm3, %xmm4
vfnmsubss 0x10(%rip), %xmm2, %xmm3, %xmm4
vfnmsubsd %xmm1, %xmm2, %xmm3, %xmm0
vfnmsubsd %xmm9, %xmm10, %xmm11, %xmm8
vfnmsubsd %xmm15, %xmm2, %xmm3, %xmm4
vfnmsubsd (%rax), %xmm2, %xmm3, %xmm4
vfnmsubsd %xmm1, (%rax), %xmm3, %xmm4
vfnmsubsd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmaddsubps %xmm1, %xmm2, %xmm3, %xmm0
vfmaddsubps %xmm9, %xmm10, %xmm11, %xmm8
vfmaddsubps %xmm15, %xmm2, %xmm3, %xmm4
vfmaddsubps (%rax), %xmm2, %xmm3, %xmm4
vfmaddsubps %xmm1, (%rax), %xmm3, %xmm4
vfmaddsubps 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmaddsubps %ymm1, %ymm2, %ymm3, %ymm0
vfmaddsubps %ymm9, %ymm10, %ymm11, %ymm8
vfmaddsubps %ymm15, %ymm2, %ymm3, %ymm4
vfmaddsubps (%rax), %ymm2, %ymm3, %ymm4
vfmaddsubps %ymm1, (%rax), %ymm3, %ymm4
vfmaddsubps 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmaddsubpd %xmm1, %xmm2, %xmm3, %xmm0
vfmaddsubpd %xmm9, %xmm10, %xmm11, %xmm8
vfmaddsubpd %xmm15, %xmm2, %xmm3, %xmm4
vfmaddsubpd (%rax), %xmm2, %xmm3, %xmm4
vfmaddsubpd %xmm1, (%rax), %xmm3, %xmm4
vfmaddsubpd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmaddsubpd %ymm1, %ymm2, %ymm3, %ymm0
vfmaddsubpd %ymm9, %ymm10, %ymm11, %ymm8
vfmaddsubpd %ymm15, %ymm2, %ymm3, %ymm4
vfmaddsubpd (%rax), %ymm2, %ymm3, %ymm4
vfmaddsubpd %ymm1, (%rax), %ymm3, %ymm4
vfmaddsubpd 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmsubaddps %xmm1, %xmm2, %xmm3, %xmm0
vfmsubaddps %xmm9, %xmm10, %xmm11, %xmm8
vfmsubaddps %xmm15, %xmm2, %xmm3, %xmm4
vfmsubaddps (%rax), %xmm2, %xmm3, %xmm4
vfmsubaddps %xmm1, (%rax), %xmm3, %xmm4
vfmsubaddps 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmsubaddps %ymm1, %ymm2, %ymm3, %ymm0
vfmsubaddps %ymm9, %ymm10, %ymm11, %ymm8
vfmsubaddps %ymm15, %ymm2, %ymm3, %ymm4
vfmsubaddps (%rax), %ymm2, %ymm3, %ymm4
vfmsubaddps %ymm1, (%rax), %ymm3, %ymm4
vfmsubaddps 0x10(%rip), %ymm2, %ymm3, %ymm4
vfmsubaddpd %xmm1, %xmm2, %xmm3, %xmm0
vfmsubaddpd %xmm9, %xmm10, %xmm11, %xmm8
vfmsubaddpd %xmm15, %xmm2, %xmm3, %xmm4
vfmsubaddpd (%rax), %xmm2, %xmm3, %xmm4
vfmsubaddpd %xmm1, (%rax), %xmm3, %xmm4
vfmsubaddpd 0x10(%rip), %xmm2, %xmm3, %xmm4
vfmsubaddpd %ymm1, %ymm2, %ymm3, %ymm0
vfmsubaddpd %ymm9, %ymm10, %ymm11, %ymm8
vfmsubaddpd %ymm15, %ymm2, %ymm3, %ymm4
vfmsubaddpd (%rax), %ymm2, %ymm3, %ymm4
vfmsubaddpd %ymm1, (%rax), %ymm3, %ymm4
vfmsubaddpd 0x10(%rip), %ymm2, %ymm3, %ymm4
vpcmov %xmm1, %xmm2, %xmm3, %xmm4
vpcmov (%rax), %xmm2, %xmm3, %xmm4
vpcmov %xmm1, (%rax), %xmm3, %xmm4
vpcmov %ymm1, %ymm2, %ymm3, %ymm4
vpcmov (%rax), %ymm2, %ymm3, %ymm4
vpcmov %ymm1, (%rax), %ymm3, %ymm4
vpperm %xmm1, %xmm2, %xmm3, %xmm4
vpperm (%rax), %xmm2, %xmm3, %xmm4
vpperm %xmm1, (%rax), %xmm3, %xmm4
vpmacsww %xmm1, %xmm2, %xmm3, %xmm4
vpmacsww %xmm1, (%rax), %xmm3, %xmm4
vpmacssww %xmm1, %xmm2, %xmm3, %xmm4
vpmacssww %xmm1, (%rax), %xmm3, %xmm4
vpmacsdd %xmm1, %xmm2, %xmm3, %xmm4
vpmacsdd %xmm1, (%rax), %xmm3, %xmm4
vpmacssdd %xmm1, %xmm2, %xmm3, %xmm4
vpmacssdd %xmm1, (%rax), %xmm3, %xmm4
vpmacsdql %xmm1, %xmm2, %xmm3, %xmm4
vpmacsdql %xmm1, (%rax), %xmm3, %xmm4
vpmacsdqh %xmm1, %xmm2, %xmm3, %xmm4
vpmacsdqh %xmm1, (%rax), %xmm3, %xmm4
vpmadcswd %xmm1, %xmm2, %xmm3, %xmm4
vpmadcswd %xmm1, (%rax), %xmm3, %xmm4
vpmadcsswd %xmm1, %xmm2, %xmm3, %xmm4
vpmadcsswd %xmm1, (%rax), %xmm3, %xmm4
vprotb %xmm1, %xmm2, %xmm3
vprotb (%rax), %xmm2, %xmm3
vprotb %xmm1, (%rax), %xmm3
vprotb $5, %xmm2, %xmm3
vprotw %xmm1, %xmm2, %xmm3
vprotw (%rax), %xmm2, %xmm3
vprotw %xmm1, (%rax), %xmm3
vprotw $5, %xmm2, %xmm3
vprotd %xmm1, %xmm2, %xmm3
vprotd (%rax), %xmm2, %xmm3
vprotd %xmm1, (%rax), %xmm3
vprotd $5, %xmm2, %xmm3
vprotq %xmm1, %xmm2, %xmm3
vprotq (%rax), %xmm2, %xmm3
vprotq %xmm1, (%rax), %xmm3
vprotq $5, %xmm2, %xmm3
vpshab %xmm1, %xmm2, %xmm3
vpshab (%rax), %xmm2, %xmm3
vpshab %xmm1, (%rax), %xmm3
vpshab %xmm9, %xmm10, %xmm11
vpshaw %xmm1, %xmm2, %xmm3
vpshaw (%rax), %xmm2, %xmm3
vpshaw %xmm1, (%rax), %xmm3
vpshaw %xmm9, %xmm10, %xmm11
vpshad %xmm1, %xmm2, %xmm3
vpshad (%rax), %xmm2, %xmm3
vpshad %xmm1, (%rax), %xmm3
vpshad %xmm9, %xmm10, %xmm11
vpshaq %xmm1, %xmm2, %xmm3
vpshaq (%rax), %xmm2, %xmm3
vpshaq %xmm1, (%rax), %xmm3
vpshaq %xmm9, %xmm10, %xmm11
vpshlb %xmm1, %xmm2, %xmm3
vpshlb (%rax), %xmm2, %xmm3
vpshlb %xmm1, (%rax), %xmm3
vpshlb %xmm9, %xmm10, %xmm11
vpshlw %xmm1, %xmm2, %xmm3
vpshlw (%rax), %xmm2, %xmm3
vpshlw %xmm1, (%rax), %xmm3
vpshlw %xmm9, %xmm10, %xmm11
vpshld %xmm1, %xmm2, %xmm3
vpshld (%rax), %xmm2, %xmm3
vpshld %xmm1, (%rax), %xmm3
vpshld %xmm9, %xmm10, %xmm11
vpshlq %xmm1, %xmm2, %xmm3
vpshlq (%rax), %xmm2, %xmm3
vpshlq %xmm1, (%rax), %xmm3
vpshlq %xmm9, %xmm10, %xmm11
vphaddbw %xmm1, %xmm2
vphaddbw (%rax), %xmm2
vphaddbw %xmm9, %xmm10
vphaddbd %xmm1, %xmm2
vphaddbd (%rax), %xmm2
vphaddbd %xmm9, %xmm10
vphaddbq %xmm1, %xmm2
vphaddbq (%rax), %xmm2
vphaddbq %xmm9, %xmm10
vphaddwd %xmm1, %xmm2
vphaddwd (%rax), %xmm2
vphaddwd %xmm9, %xmm10
vphaddwq %xmm1, %xmm2
vphaddwq (%rax), %xmm2
vphaddwq %xmm9, %xmm10
vphadddq %xmm1, %xmm2
vphadddq (%rax), %xmm2
vphadddq %xmm9, %xmm10
vphaddubw %xmm1, %xmm2
vphaddubw (%rax), %xmm2
vphaddubw %xmm9, %xmm10
vphaddubd %xmm1, %xmm2
vphaddubd (%rax), %xmm2
vphaddubd %xmm9, %xmm10
vphaddubq %xmm1, %xmm2
vphaddubq (%rax), %xmm2
vphaddubq %xmm9, %xmm10
vphadduwd %xmm1, %xmm2
vphadduwd (%rax), %xmm2
vphadduwd %xmm9, %xmm10
vphadduwq %xmm1, %xmm2
vphadduwq (%rax), %xmm2
vphadduwq %xmm9, %xmm10
vphaddudq %xmm1, %xmm2
vphaddudq (%rax), %xmm2
vphaddudq %xmm9, %xmm10
vphsubbw %xmm1, %xmm2
vphsubbw (%rax), %xmm2
vphsubbw %xmm9, %xmm10
vphsubwd %xmm1, %xmm2
vphsubwd (%rax), %xmm2
vphsubwd %xmm9, %xmm10
vphsubdq %xmm1, %xmm2
vphsubdq (%rax), %xmm2
vphsubdq %xmm9, %xmm10
vfrczps %xmm1, %xmm2
vfrczps (%rax), %xmm2
vfrczps %xmm9, %xmm10
vfrczpd %xmm1, %xmm2
vfrczpd (%rax), %xmm2
vfrczpd %xmm9, %xmm10
vfrczss %xmm1, %xmm2
vfrczss (%rax), %xmm2
vfrczss %xmm9, %xmm10
vfrczsd %xmm1, %xmm2
vfrczsd (%rax), %xmm2
vfrczsd %xmm9, %xmm10
vpcomb $0, %xmm1, %xmm2, %xmm3
vpcomb $0, (%rax), %xmm2, %xmm3
vpcomb $3, %xmm1, %xmm2, %xmm3
vpcomb $3, (%rax), %xmm2, %xmm3
vpcomb $7, %xmm1, %xmm2, %xmm3
vpcomb $7, (%rax), %xmm2, %xmm3
vpcomw $0, %xmm1, %xmm2, %xmm3
vpcomw $0, (%rax), %xmm2, %xmm3
vpcomw $3, %xmm1, %xmm2, %xmm3
vpcomw $3, (%rax), %xmm2, %xmm3
vpcomw $7, %xmm1, %xmm2, %xmm3
vpcomw $7, (%rax), %xmm2, %xmm3
vpcomd $0, %xmm1, %xmm2, %xmm3
vpcomd $0, (%rax), %xmm2, %xmm3
vpcomd $3, %xmm1, %xmm2, %xmm3
vpcomd $3, (%rax), %xmm2, %xmm3
vpcomd $7, %xmm1, %xmm2, %xmm3
vpcomd $7, (%rax), %xmm2, %xmm3
vpcomq $0, %xmm1, %xmm2, %xmm3
vpcomq $0, (%rax), %xmm2, %xmm3
vpcomq $3, %xmm1, %xmm2, %xmm3
vpcomq $3, (%rax), %xmm2, %xmm3
vpcomq $7, %xmm1, %xmm2, %xmm3
vpcomq $7, (%rax), %xmm2, %xmm3
vpcomub $0, %xmm1, %xmm2, %xmm3
vpcomub $0, (%rax), %xmm2, %xmm3
vpcomub $3, %xmm1, %xmm2, %xmm3
vpcomub $3, (%rax), %xmm2, %xmm3
vpcomub $7, %xmm1, %xmm2, %xmm3
vpcomub $7, (%rax), %xmm2, %xmm3
vpcomuw $0, %xmm1, %xmm2, %xmm3
vpcomuw $0, (%rax), %xmm2, %xmm3
vpcomuw $3, %xmm1, %xmm2, %xmm3
vpcomuw $3, (%rax), %xmm2, %xmm3
vpcomuw $7, %xmm1, %xmm2, %xmm3
vpcomuw $7, (%rax), %xmm2, %xmm3
vpcomud $0, %xmm1, %xmm2, %xmm3
vpcomud $0, (%rax), %xmm2, %xmm3
vpcomud $3, %xmm1, %xmm2, %xmm3
vpcomud $3, (%rax), %xmm2, %xmm3
vpcomud $7, %xmm1, %xmm2, %xmm3
vpcomud $7, (%rax), %xmm2, %xmm3
vpcomuq $0, %xmm1, %xmm2, %xmm3
vpcomuq $0, (%rax), %xmm2, %xmm3
vpcomuq $3, %xmm1, %xmm2, %xmm3
vpcomuq $3, (%rax), %xmm2, %xmm3
vpcomuq $7, %xmm1, %xmm2, %xmm3
vpcomuq $7, (%rax), %xmm2, %xmm3
vpermil2ps $1, %xmm1, %xmm2, %xmm3, %xmm4
vpermil2ps $2, (%rax), %xmm2, %xmm3, %xmm4
vpermil2ps $0, %xmm1, (%rax), %xmm3, %xmm4
vpermil2ps $1, %ymm1, %ymm2, %ymm3, %ymm4
vpermil2ps $2, (%rax), %ymm2, %ymm3, %ymm4
vpermil2ps $0, %ymm1, (%rax), %ymm3, %ymm4
vpermil2pd $1, %xmm1, %xmm2, %xmm3, %xmm4
vpermil2pd $2, (%rax), %xmm2, %xmm3, %xmm4
vpermil2pd $0, %xmm1, (%rax), %xmm3, %xmm4
vpermil2pd $1, %ymm1, %ymm2, %ymm3, %ymm4
vpermil2pd $2, (%rax), %ymm2, %ymm3, %ymm4
vpermil2pd $0, %ymm1, (%rax), %ymm3, %ymm4
blcfill %eax, %ebx
blcfill %rax, %rbx
blcfill %r9, %r10
blcfill (%rax), %rbx
blci %eax, %ebx
blci %rax, %rbx
blci %r9, %r10
blci (%rax), %rbx
blcic %eax, %ebx
blcic %rax, %rbx
blcic %r9, %r10
blcic (%rax), %rbx
blcmsk %eax, %ebx
blcmsk %rax, %rbx
blcmsk %r9, %r10
blcmsk (%rax), %rbx
blcs %eax, %ebx
blcs %rax, %rbx
blcs %r9, %r10
blcs (%rax), %rbx
blsfill %eax, %ebx
blsfill %rax, %rbx
blsfill %r9, %r10
blsfill (%rax), %rbx
blsic %eax, %ebx
blsic %rax, %rbx
blsic %r9, %r10
blsic (%rax), %rbx
t1mskc %eax, %ebx
t1mskc %rax, %rbx
t1mskc %r9, %r10
t1mskc (%rax), %rbx
tzmsk %eax, %ebx
tzmsk %rax, %rbx
tzmsk %r9, %r10
tzmsk (%rax), %rbx
bextr $0x1234, %eax, %ebx
bextr $0x1234, (%rax), %rbx
bextr $5, %r9, %r10
extrq $1, $2, %xmm0
extrq %xmm1, %xmm0
insertq $1, $2, %xmm1, %xmm0
insertq %xmm1, %xmm0
movntsd %xmm0, (%rax)
movntss %xmm1, (%rbx)
lzcnt %eax, %ebx
popcnt %rax, %rbx
pfadd %mm1, %mm0
pfadd (%rax), %mm2
pfsub %mm1, %mm0
pfsub (%rax), %mm2
pfmul %mm1, %mm0
pfmul (%rax), %mm2
pfacc %mm1, %mm0
pfacc (%rax), %mm2
pfcmpeq %mm1, %mm0
pfcmpeq (%rax), %mm2
pfcmpge %mm1, %mm0
pfcmpge (%rax), %mm2
pfcmpgt %mm1, %mm0
pfcmpgt (%rax), %mm2
pfmax %mm1, %mm0
pfmax (%rax), %mm2
pfmin %mm1, %mm0
pfmin (%rax), %mm2
pfrcp %mm1, %mm0
pfrcp (%rax), %mm2
pfrsqrt %mm1, %mm0
pfrsqrt (%rax), %mm2
pfsubr %mm1, %mm0
pfsubr (%rax), %mm2
pi2fd %mm1, %mm0
pi2fd (%rax), %mm2
pf2id %mm1, %mm0
pf2id (%rax), %mm2
pavgusb %mm1, %mm0
pavgusb (%rax), %mm2
pmulhrw %mm1, %mm0
pmulhrw (%rax), %mm2
pfrcpit1 %mm1, %mm0
pfrcpit1 (%rax), %mm2
pfrcpit2 %mm1, %mm0
pfrcpit2 (%rax), %mm2
pfrsqit1 %mm1, %mm0
pfrsqit1 (%rax), %mm2
pi2fw %mm1, %mm0
pi2fw (%rax), %mm2
pf2iw %mm1, %mm0
pf2iw (%rax), %mm2
pfnacc %mm1, %mm0
pfnacc (%rax), %mm2
pfpnacc %mm1, %mm0
pfpnacc (%rax), %mm2
pswapd %mm1, %mm0
pswapd (%rax), %mm2
femms
prefetch (%rax)
prefetchw (%rax)
clzero
monitorx
mwaitx
invlpgb
tlbsync
clgi
stgi
vmrun
vmload
vmsave
vmmcall
skinit
invlpga
rdpid %rax
wbnoinvd
